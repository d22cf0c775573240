"""A tiny text encoder of our own: hashed word tokens → a small transformer encoder.

FLUX.2-klein uses Qwen3-4B and SD3.5 uses CLIP+T5; neither ships in a package, so the embedded
model encodes instructions itself. Words are hashed (crc32, stable across runs and machines)
into a fixed vocabulary, so there is no vocabulary file to ship and unknown words still map
somewhere. The sequence length is fixed, which keeps exported graphs static.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import asdict, dataclass

import torch
from torch import nn

PAD, BOS = 0, 1
_WORD = re.compile(r"[a-z0-9]+")


@dataclass
class TextEncoderConfig:
    vocab_size: int = 2048
    max_tokens: int = 16
    dim: int = 128
    layers: int = 2
    heads: int = 4
    instruction_dim: int = 0  # > 0: a projection of the pooled vector to this width (Flux2's time embedding)


def tokenize(text: str, cfg: TextEncoderConfig) -> torch.Tensor:
    """Lower-case words hashed into ``[2, vocab)``; BOS first, padded to ``max_tokens``."""
    words = _WORD.findall(text.lower())[: cfg.max_tokens - 1]
    ids = [BOS] + [2 + zlib.crc32(w.encode()) % (cfg.vocab_size - 2) for w in words]
    ids += [PAD] * (cfg.max_tokens - len(ids))
    return torch.tensor(ids, dtype=torch.long)


class TinyTextEncoder(nn.Module):
    def __init__(self, cfg: TextEncoderConfig | None = None):
        super().__init__()
        self.cfg = cfg or TextEncoderConfig()
        c = self.cfg
        self.embed = nn.Embedding(c.vocab_size, c.dim)
        self.pos = nn.Parameter(torch.zeros(c.max_tokens, c.dim))
        layer = nn.TransformerEncoderLayer(c.dim, c.heads, 4 * c.dim, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, c.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(c.dim)
        # zero at initialisation: a model warm-started from weights without it computes what they computed
        # its input is the pooled state and the mean raw word embedding: a bag of words keeps words the encoder
        # has not learnt to tell apart yet (colour names) as distinct as their random embeddings
        self.instruction_proj = nn.Linear(2 * c.dim, c.instruction_dim) if c.instruction_dim else None
        if self.instruction_proj is not None:
            nn.init.zeros_(self.instruction_proj.weight)
            nn.init.zeros_(self.instruction_proj.bias)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids`` (B, L) → token states (B, L, dim) and a pooled vector (B, dim; with an instruction
        projection, (B, 2·dim): the pooled states and the mean word embedding)."""
        words = self.embed(ids)
        h = self.norm(self.encoder(words + self.pos[: ids.shape[1]]))
        keep = (ids != PAD).unsqueeze(-1).to(h.dtype)
        count = keep.sum(1).clamp(min=1)
        pooled = (h * keep).sum(1) / count
        if self.instruction_proj is not None:
            pooled = torch.cat([pooled, (words * keep).sum(1) / count], -1)
        return h, pooled

    def instruction(self, pooled: torch.Tensor) -> torch.Tensor | None:
        """(B, 2·dim) pooled vector → (B, instruction_dim) added to the transformer's time embedding, or None."""
        return None if self.instruction_proj is None else self.instruction_proj(pooled)

    @torch.no_grad()
    def encode(self, texts: list[str] | str) -> tuple[torch.Tensor, torch.Tensor]:
        texts = [texts] if isinstance(texts, str) else texts
        ids = torch.stack([tokenize(t, self.cfg) for t in texts]).to(self.embed.weight.device)
        return self(ids)

    def config_dict(self) -> dict:
        return asdict(self.cfg)
