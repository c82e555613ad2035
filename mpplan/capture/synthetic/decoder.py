"""The transformer family: a pre-norm decoder whose attention scores are the big tensors."""

from __future__ import annotations

from mpplan.capture.synthetic.arguments import check_common, positive
from mpplan.capture.synthetic.builder import Builder
from mpplan.capture.synthetic.layers import layernorm, linear
from mpplan.graph import Graph


def transformer(
    layers: int,
    *,
    batch: int = 4,
    seq: int = 512,
    hidden: int = 768,
    heads: int = 12,
    ffn: int | None = None,
    vocab: int = 32000,
    dtype: str = "float32",
    train: bool = False,
    optimizer: str | None = None,
    seed: int | None = None,
    name: str | None = None,
) -> Graph:
    """A pre-norm decoder of ``layers`` blocks (GPT-2 small sizes by default).

    ``embed`` (token embedding) then per layer ``layers.<i>``: ``ln1``, ``attn.qkv``
    (Linear to ``3 * hidden``), ``attn.split`` (q, k, v as views of qkv),
    ``attn.scores`` (``[batch, heads, seq, seq]``), ``attn.softmax``,
    ``attn.context``, ``attn.proj``, residual ``add1``, ``ln2``, ``mlp.fc1``,
    ``mlp.act`` (GELU), ``mlp.fc2``, residual ``add2``; then ``ln_f``, ``lm_head``
    (logits over ``vocab``) and in train mode a cross-entropy loss.
    ``ffn`` defaults to ``4 * hidden``.
    """
    check_common("transformer", dtype, train, optimizer, seed, name)
    ffn = 4 * hidden if ffn is None else ffn
    positive("transformer", layers=layers, batch=batch, seq=seq, hidden=hidden, heads=heads, ffn=ffn, vocab=vocab)
    if hidden % heads:
        raise ValueError(f"transformer: hidden ({hidden}) must be a multiple of heads ({heads})")
    b = Builder(dtype, seed, train)
    head = hidden // heads
    rows = batch * seq
    bsd = (batch, seq, hidden)
    tokens = b.input("tokens", (batch, seq), "int64")
    table = b.param("embed.weight", (vocab, hidden), module="embed")
    h = b.compute("embed", "Embedding", [tokens, table], bsd, module="embed", saved=[tokens])
    for i in range(layers):
        p = f"layers.{i}"
        a = layernorm(b, f"{p}.ln1", h, hidden)
        qkv = linear(b, f"{p}.attn.qkv", a, hidden, 3 * hidden)
        split = [(f"{p}.attn.{x}", (batch, heads, seq, head)) for x in "qkv"]
        q, k, v = b.view(f"{p}.attn.split", "Split", qkv, split, module=f"{p}.attn")
        bhss = (batch, heads, seq, seq)
        scores = b.compute(
            f"{p}.attn.scores", "MatMul", [q, k], bhss, module=f"{p}.attn", flops=2 * rows * seq * hidden
        )
        probs = b.compute(f"{p}.attn.softmax", "Softmax", [scores], bhss, module=f"{p}.attn", saved=["@out"])
        ctx = b.compute(
            f"{p}.attn.context", "MatMul", [probs, v], bsd, module=f"{p}.attn", flops=2 * rows * seq * hidden
        )
        h1 = b.add(f"{p}.add1", h, linear(b, f"{p}.attn.proj", ctx, hidden, hidden), module=p)
        m = layernorm(b, f"{p}.ln2", h1, hidden)
        m = linear(b, f"{p}.mlp.fc1", m, hidden, ffn)
        m = b.compute(f"{p}.mlp.act", "GELU", [m], (batch, seq, ffn), module=f"{p}.mlp.act", flops=8 * rows * ffn)
        h = b.add(f"{p}.add2", h1, linear(b, f"{p}.mlp.fc2", m, ffn, hidden), module=p)
    h = layernorm(b, "ln_f", h, hidden)
    logits = linear(b, "lm_head", h, hidden, vocab, bias=False)
    if train:
        b.loss("CrossEntropyLoss", [logits, b.input("labels", (batch, seq), "int64")])
    return b.graph(name or f"transformer{layers}", logits, optimizer=optimizer)
