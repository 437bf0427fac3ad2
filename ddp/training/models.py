"""The models: `toy` (a small MLP for correctness checks) and a decoder-only Transformer LM.

The LM uses RMSNorm, SwiGLU, rotary position embeddings, causal attention and an untied head.
Submodules are registered in the order backward reaches them reversed, so reverse registration
order (the wrappers' all-reduce order) follows the order gradients become ready.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VOCAB_SIZE = 10_000
TOY_FEATURES, TOY_CLASSES = 16, 4


@dataclass(frozen=True)
class ModelSize:
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int

    def __post_init__(self):
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise ValueError(f"d_model {self.d_model} must split into {self.num_heads} heads of even size")


MODEL_SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(128, 512, 2, 4),
    "small": ModelSize(768, 3072, 12, 12),
    "medium": ModelSize(1024, 4096, 24, 16),
    "large": ModelSize(1280, 5120, 36, 20),
    "xl": ModelSize(1600, 6400, 48, 25),
    "2.7B": ModelSize(2560, 10240, 32, 32),
}
MODEL_NAMES = ["toy", *MODEL_SIZES]


class ToyMLP(nn.Module):
    """16 features -> 32 -> 32 -> 4 classes."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.fc1 = nn.Linear(TOY_FEATURES, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, TOY_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(head_dim: int, max_len: int, base: float = 10_000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency, shape (max_len, head_dim // 2)."""
    freqs = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (even, odd) of the last dim of x (batch, heads, seq, head_dim) by position."""
    seq = x.shape[-2]
    cos, sin = cos[:seq].to(x.dtype), sin[:seq].to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class CausalSelfAttention(nn.Module):
    rope_cos: torch.Tensor  # buffers (registered in __init__), declared for the type checker
    rope_sin: torch.Tensor

    def __init__(self, d_model: int, num_heads: int, max_len: int):
        super().__init__()
        self.num_heads = num_heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)
        cos, sin = rotary_tables(d_model // num_heads, max_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape

        def heads(proj: nn.Linear) -> torch.Tensor:
            return proj(x).view(b, t, self.num_heads, d // self.num_heads).transpose(1, 2)

        q = apply_rotary(heads(self.wq), self.rope_cos, self.rope_sin)
        k = apply_rotary(heads(self.wk), self.rope_cos, self.rope_sin)
        y = F.scaled_dot_product_attention(q, k, heads(self.wv), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)  # gate
        self.w3 = nn.Linear(d_model, d_ff, bias=False)  # up
        self.w2 = nn.Linear(d_ff, d_model, bias=False)  # down: its gradient is ready first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, size: ModelSize, max_len: int):
        super().__init__()
        self.attn_norm = RMSNorm(size.d_model)
        self.attn = CausalSelfAttention(size.d_model, size.num_heads, max_len)
        self.mlp_norm = RMSNorm(size.d_model)
        self.mlp = SwiGLU(size.d_model, size.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TransformerLM(nn.Module):
    """Decoder-only LM: token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, size: ModelSize, vocab_size: int = VOCAB_SIZE, max_len: int = 1024):
        super().__init__()
        self.max_len = max_len
        self.tok_emb = nn.Embedding(vocab_size, size.d_model)
        self.blocks = nn.ModuleList(Block(size, max_len) for _ in range(size.num_layers))
        self.norm = RMSNorm(size.d_model)
        self.lm_head = nn.Linear(size.d_model, vocab_size, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * size.num_layers) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] > self.max_len:
            raise ValueError(f"context length {tokens.shape[1]} exceeds the model's max_len {self.max_len}")
        x = self.tok_emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def build_model(name: str, context_length: int = 256, seed: int = 0) -> nn.Module:
    """Model `name` ("toy" or a key of MODEL_SIZES), initialised from `seed`."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}: choose from {', '.join(MODEL_NAMES)}")
    torch.manual_seed(seed)
    if name == "toy":
        return ToyMLP()
    return TransformerLM(MODEL_SIZES[name], max_len=context_length)


def parameter_count(name: str) -> int:
    """Parameters of model `name`, computed from its shape table without building it."""
    if name == "toy":
        return sum(p.numel() for p in ToyMLP().parameters())
    s = MODEL_SIZES[name]
    per_layer = 4 * s.d_model**2 + 3 * s.d_model * s.d_ff + 2 * s.d_model
    return 2 * VOCAB_SIZE * s.d_model + s.num_layers * per_layer + s.d_model


def estimated_training_bytes(name: str, batch_per_rank: int, context_length: int, optimizer: str = "adamw") -> int:
    """Rough peak memory of one rank in float32: weights, grads, comm buffers, optimizer state, activations."""
    params = parameter_count(name)
    state_copies = 2 if optimizer == "adamw" else 0
    weights = params * 4 * (3 + state_copies)  # param, grad, flat/bucket buffer (+ Adam's m and v)
    if name == "toy":
        return weights
    s = MODEL_SIZES[name]
    tokens = batch_per_rank * context_length
    # Saved activations per layer (~16 d_model + 3 d_ff floats per token, attention via SDPA),
    # plus the logits and their gradient.
    activations = tokens * (s.num_layers * (16 * s.d_model + 3 * s.d_ff) + 3 * VOCAB_SIZE) * 4
    return weights + activations


def largest_model_that_fits(
    free_bytes: int, batch_per_rank: int, context_length: int, optimizer: str = "adamw", headroom: float = 0.8
) -> str:
    """The largest Transformer size whose estimate fits in `headroom` of `free_bytes` ("tiny" if none)."""
    fitting = [
        n
        for n in MODEL_SIZES
        if estimated_training_bytes(n, batch_per_rank, context_length, optimizer) <= headroom * free_bytes
    ]
    return max(fitting, key=parameter_count) if fitting else "tiny"
