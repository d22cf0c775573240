"""The app reaches a device agent through a Unix socket (`sakura demo --link kernel`: the agent lives in a network
namespace, the socket's path crosses it). A stand-in agent behind the real agent server; no root needed."""

from __future__ import annotations

from device_bridge.server import bind_unix, create_app, parse_listen, uvicorn_config
from device_bridge.transport import WsBridge
from sakura.net.listen import serve_in_thread


class StandIn:
    def health(self) -> dict:
        return {"status": "ok", "who": "stand-in"}

    def templates(self) -> list[dict]:
        return [{"id": "fs-astronaut"}]

    def edit_events(self, job, emit, cancel):  # not reached here
        raise NotImplementedError


def test_listen_takes_a_unix_socket_path():
    assert parse_listen("unix:/tmp/a.sock") == ("unix:/tmp/a.sock", 0)
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)


def test_the_bridge_talks_to_an_agent_over_a_unix_socket(tmp_path):
    path = tmp_path / "agent.sock"
    sock = bind_unix(str(path))
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    server, thread = serve_in_thread(uvicorn_config(create_app(StandIn())), sock, name="agent-unix", what="agent")
    try:
        bridge = WsBridge(f"unix:{path}")
        assert bridge.health()["who"] == "stand-in"
        assert bridge.templates() == [{"id": "fs-astronaut"}]
    finally:
        server.should_exit = True
        thread.join(5)
