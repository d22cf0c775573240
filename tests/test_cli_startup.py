"""Start-up cost of the processes the tests (and users) start many times: every `sakura ...` process registers
every command, and the template server starts for each test that needs one. Neither may import torch,
diffusers, gradio or ExecuTorch before a command needs them (they cost ~15 s of CPU together)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from sakura.cli.errors import EXPECTED_ELSEWHERE

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "diffusers", "gradio", "executorch")
COMMANDS = ("edit", "build", "pack-info", "serve", "bench", "report", "train-tiny", "export", "bench-device",
            "loadtest", "demo", "device", "catalog", "store", "study")


def child(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object, with the heavy modules it imported."""
    code = textwrap.dedent(code) + f"\nout['heavy'] = [m for m in {HEAVY!r} if m in sys.modules]\n" \
                                   "print(json.dumps(out))\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_sakura_help_and_command_help_import_no_heavy_module(tmp_path):
    out = child(f"""
        import json, sys
        from typer.testing import CliRunner
        from sakura import cli
        cli._register_runtime_commands()  # what main() does before it parses the command line
        cli._register_plugins()
        out = {{}}
        for args in ([], ["demo"], ["device"], ["export"], ["bench-device"], ["loadtest"], ["store"], ["study"],
                     ["study", "serve"]):
            r = CliRunner().invoke(cli.app, [*args, "--help"])
            out[" ".join(args)] = [r.exit_code, r.stdout]
        r = CliRunner().invoke(cli.app, ["pack-info", {str(tmp_path / "missing" / "x")!r}])
        out["error"] = [r.exit_code, r.stderr]
    """)
    assert out["heavy"] == []
    code, text = out[""]
    assert code == 0 and all(f" {name} " in text for name in COMMANDS), text
    for args, option in (("demo", "--packs"), ("device", "--timeout"), ("export", "--backend"),
                         ("bench-device", "--template"), ("loadtest", "--clients"), ("store", "gc"),
                         ("study", "report"), ("study serve", "--operator-port")):
        code, text = out[args]
        assert code == 0 and option in text, (args, text)
    code, err = out["error"]  # an expected error is still one line and exit 2
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err


def test_template_server_imports_no_torch():
    out = child("""
        import json, sys
        import sakura.server.__main__, sakura.server.store_app, sakura.net.s3store, sakura.formats.inspect
        out = {}
    """)
    assert out["heavy"] == []


def test_expected_errors_are_named_by_their_module():
    """cli_errors looks these classes up among the imported modules only: each must be named by the module
    that defines it (or a package above it, which is imported first)."""
    for mod, name in EXPECTED_ELSEWHERE:
        cls = getattr(importlib.import_module(mod), name)
        assert issubclass(cls, BaseException) and (cls.__module__ == mod or cls.__module__.startswith(mod + ".")), \
            (mod, name, cls.__module__)
