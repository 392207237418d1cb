"""Tiny random-weight GGUF models of llama.cpp's architectures, written with the `gguf` package
(docs/design.md, "Which models"): a few layers, small widths, SmolLM2's tokenizer copied so that text
tokenizes as it does for the real model. Random weights prove the mechanism (the cache must give
stock llama.cpp's logits), not quality. Nothing here is committed as a model file: tests write
them into their temporary folders.

Tensor names, shapes and keys follow llama.cpp 0c1e570's loaders (src/models/<arch>.cpp,
load_arch_hparams and load_arch_tensors).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import numpy as np

# What each architecture's layers hold beyond llama's (attn_norm, q/k/v/output, ffn_norm, gated
# FFN, output tied to token_embd):
#   qkv_bias     q/k/v biases                   out_bias   attn_output bias
#   qk_norm      per-head q/k RMS norms          qk_norm_rows  q/k norms over all heads' rows (olmo2)
#   fused_qkv    one attn_qkv tensor (phi3)      fused_up   ffn_up of 2*n_ff holding gate and up (phi3)
#   no_gate      ffn_up/ffn_down only            ffn_bias   FFN biases
#   layer_norm   LayerNorm (layer_norm_epsilon) instead of RMSNorm; norm_bias: norms have biases
#   post_norms   attn_post_norm and ffn_post_norm after each block
#   no_pre_norms neither attn_norm nor ffn_norm (olmo2 norms after the blocks only)
#   parallel     attention and FFN read the same attn_norm output: no ffn_norm (cohere2)
#   output       an untied output.weight (olmo2's loader requires one)
#   sinks        attn_sinks: one f32 logit per head that joins each row's softmax (no value), drawn
#                in 0..2 so that it takes a visible share of the attention
#   swa_layers   attention.sliding_window_pattern as a per-layer bool array (granite_swa's and gemma4's
#                loaders require one): TinySpec.sliding, else layer il slides unless il % 4 == 0
#                (granite_swa's converter's default)
#   no_norms     LayerNorms without weights: no norm tensors at all, output_norm included (olmo)
#   ffn_norm_post_attn  the FFN's pre-norm is stored as post_attention_norm, with no ffn_norm (gpt-oss)
#   moe          a routed MoE FFN instead of the dense one: ffn_gate_inp and ffn_{gate,up,down}_exps
#                (KEYS' expert_count, expert_used_count, expert_feed_forward_length)
#   moe_bias     biases on the router and the experts (gpt-oss)
#   k_eq_v       full-attention layers have no attn_v: llama.cpp takes V from K's projection, before
#                K's norm and rope (Gemma 4's attention_k_eq_v, as in its 31B and 26B-A4B)
#   rope_freqs   one rope_freqs tensor for the full-attention layers: a quarter of each head rotates,
#                the rest is held still by factors of 1e30 (Gemma 4's "proportional" rope)
#   out_scale    layer_output_scale: one scalar multiplying each layer's output (Gemma 4)
ARCHS: dict[str, frozenset] = {
    a: frozenset(f.split())
    for a, f in {
        "llama": "",
        "mistral3": "",
        "granite": "",
        "smollm3": "",  # llama.cpp hard-codes its no-rope layers (every 4th): use n_layer >= 4 to have one
        "qwen2": "qkv_bias",
        "qwen3": "qk_norm",
        "phi3": "fused_qkv fused_up",
        "olmo2": "qk_norm_rows post_norms no_pre_norms output",
        "starcoder2": "layer_norm norm_bias qkv_bias out_bias no_gate ffn_bias",
        "cohere2": "layer_norm parallel",
        "gemma2": "post_norms",
        "gemma3": "post_norms qk_norm",
        # granite_swa (llama.cpp's name, with "_"): granite with per-layer sliding windows and sinks
        "granite_swa": "sinks swa_layers",
        "exaone": "",
        "exaone4": "qk_norm post_norms no_pre_norms",  # sliding windows only at 64 layers (32B)
        "glm4": "post_norms fused_up",
        "internlm2": "output",
        "stablelm": "layer_norm norm_bias output",
        "command-r": "layer_norm parallel",  # q/k norms only at >= 64 layers
        "gemma": "",
        "qwen3moe": "qk_norm moe",
        "olmo": "layer_norm no_norms",
        # gpt-oss (llama.cpp's openai-moe): even layers slide (its loader's default pattern 2), sinks,
        # MoE with biases
        "gpt-oss": "qkv_bias out_bias sinks ffn_norm_post_attn moe moe_bias output",
        # gemma4 without per-layer embeddings or shared KV layers (its 31B's layout)
        "gemma4": "post_norms qk_norm swa_layers k_eq_v rope_freqs out_scale",
        # deci (Nemotron 51B/49B): llama's layers, each with its own KV head count (kvgguf refuses
        # full-attention layers of different shapes; stock llama.cpp runs them)
        "deci": "",
    }.items()
}

# Metadata the loaders require, or that makes the tiny model exercise the architecture's extras
# (keys without "{arch}."; TinySpec's fields and extra override them). Windows are small so that a few hundred
# tokens slide out of them; softcaps are small so that they bite on random weights.
_GRANITE = {"attention.scale": 0.0625, "embedding_scale": 12.0, "residual_scale": 0.22, "logit_scale": 8.0}
_MOE = {"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32}  # tiny experts
KEYS: dict[str, dict] = {
    "granite": _GRANITE,
    # granite_swa: logit_scale and sliding_window are required (its pattern comes from "swa_layers")
    "granite_swa": {**_GRANITE, "attention.sliding_window": 32},
    # cohere2: of every 4 layers, 3 slide (with rope) and the 4th attends to all (without rope)
    "cohere2": {"attention.sliding_window": 32, "logit_scale": 0.125},
    # gemma2: even layers slide, odd ones are full (llama.cpp's default pattern 2)
    "gemma2": {"attention.sliding_window": 32, "attn_logit_softcapping": 5.0, "final_logit_softcapping": 10.0},
    "command-r": {"logit_scale": 0.125},
    "qwen3moe": _MOE,
    "gpt-oss": {**_MOE, "attention.sliding_window": 32},  # both required
    # gemma4: embedding_length_per_layer_input is required (0: none); head dims of the sliding layers
    # come from TinySpec.head_dim_swa; rope bases as Gemma 4's (10K sliding, 1M full)
    "gemma4": {
        "attention.sliding_window": 32,
        "embedding_length_per_layer_input": 0,
        "attention.shared_kv_layers": 0,
        "rope.freq_base": 1e6,
        "rope.freq_base_swa": 1e4,
        "final_logit_softcapping": 10.0,
    },
}


@dataclass(frozen=True)
class TinySpec:
    arch: str = "llama"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    # a tuple: per-layer counts, written as an array (llama.cpp reads one; its llama loader sizes every
    # layer's K/V tensors by layer 0, so only equal counts load there)
    n_head_kv: Union[int, tuple[int, ...]] = 2
    head_dim: Optional[int] = None  # None: n_embd / n_head (key_length and value_length unwritten)
    # the sliding layers' head dim (attention.key_length_swa, value_length_swa, rope.dimension_count_swa),
    # where it differs from the full layers' (gemma4)
    head_dim_swa: Optional[int] = None
    # which layers slide, written as attention.sliding_window_pattern (for "swa_layers" archs)
    sliding: Optional[tuple[bool, ...]] = None
    n_ff: int = 128
    n_ctx_train: int = 4096
    # attention.sliding_window; phi3's converter writes one into every file and llama.cpp ignores it
    sliding_window: Optional[int] = None
    # LongRoPE's original context: rope.scaling.type "longrope" and rope_factors_long/short; llama.cpp
    # takes the long factors when n_ctx_seq > this (llama_model::get_rope_factors)
    longrope: Optional[int] = None
    extra: dict = field(default_factory=dict)  # more metadata, keys without the "{arch}." prefix
    # the vocabulary's size: None keeps the copied tokenizer's; larger pads it with unused tokens, so
    # that a model of a real shape has its real output matmul (benchmarks/shapes.py)
    n_vocab: Optional[int] = None
    weights: str = "f16"  # or "q4_0": matrices as llama.cpp's Q4_0, as laptops run them

    @property
    def hd(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    def kv_heads(self, il: int) -> int:
        return self.n_head_kv[il] if isinstance(self.n_head_kv, tuple) else self.n_head_kv

    @property
    def swa_pattern(self) -> Optional[tuple[bool, ...]]:
        """Which layers slide, where the GGUF lists them ("swa_layers" archs), else None."""
        if "swa_layers" not in ARCHS[self.arch]:
            return None
        return self.sliding or tuple(il % 4 != 0 for il in range(self.n_layer))

    def layer_hd(self, il: int) -> int:
        """Layer il's head dim: head_dim_swa on sliding layers where the GGUF lists them."""
        pattern = self.swa_pattern
        return self.head_dim_swa if self.head_dim_swa and pattern and pattern[il] else self.hd


@functools.lru_cache(maxsize=None)
def _tokenizer_fields(source: str) -> tuple:
    """(name, value, types) of source's tokenizer.* keys, read once per process: SmolLM2's GGUF
    holds 49K-token arrays that take seconds to read. A .pkl source is the GPU kit's copy of them
    (scripts/gpu_kit.sh: {name: (types, value)}), where the 98 MB model cannot travel."""
    import gguf

    if source.endswith(".pkl"):
        import pickle

        with open(source, "rb") as f:
            return tuple((name, value, types) for name, (types, value) in pickle.load(f).items())
    reader = gguf.GGUFReader(source)
    return tuple((name, f.contents(), f.types) for name, f in reader.fields.items() if name.startswith("tokenizer."))


def _add(w, key: str, value) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        w.add_array(key, list(value))


def _add_tokenizer(w, tokenizer_from: Path, n_vocab: Optional[int] = None) -> int:
    """Copies tokenizer_from's tokenizer.* keys into w, the token list padded to n_vocab with
    unused tokens; returns the vocabulary's size."""
    import gguf

    fields = _tokenizer_fields(str(tokenizer_from))
    pad = max(0, (n_vocab or 0) - len(next(v for n, v, _ in fields if n == "tokenizer.ggml.tokens")))
    padding = {
        "tokenizer.ggml.tokens": [f"<|unused_{i}|>" for i in range(pad)],
        "tokenizer.ggml.token_type": [int(gguf.TokenType.UNUSED)] * pad,
        "tokenizer.ggml.scores": [0.0] * pad,
    }
    n_vocab = 0
    for name, value, types in fields:
        if types[0] == gguf.GGUFValueType.ARRAY:
            value = list(value) + padding.get(name, []) if pad else value
            w.add_array(name, value)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        else:
            w.add_key_value(name, value, types[0])
    return n_vocab


def _tensor_writers(w, rng, weights: str = "f16"):
    """t(name, *shape): random weights (f16 or Q4_0 unless 1-D or f32=True); ones(name, n): norm
    weights near 1."""
    import gguf

    def t(name: str, *shape: int, scale: float = 0.08, f32: bool = False) -> None:
        x = rng.standard_normal(shape).astype(np.float32) * scale
        if len(shape) == 1 or f32:
            w.add_tensor(name, x)
        elif weights == "q4_0" and shape[-1] % 32 == 0:
            q4 = gguf.GGMLQuantizationType.Q4_0
            w.add_tensor(name, gguf.quants.quantize(x, q4), raw_dtype=q4)
        else:
            w.add_tensor(name, x.astype(np.float16))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    return t, ones


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write(path: Path, spec: TinySpec, tokenizer_from: Path, seed: int = 0) -> Path:
    """Writes a GGUF of spec's shape with random f16 weights; returns its path."""
    import gguf

    a = spec.arch
    has = ARCHS[a]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), a)
    w.add_name("tiny")  # not the arch: llama.cpp looks up Phi-3's special tokens in a model named "phi3"
    keys = {
        "context_length": spec.n_ctx_train,
        "embedding_length": spec.n_embd,
        "block_count": spec.n_layer,
        "feed_forward_length": spec.n_ff,
        "attention.head_count": spec.n_head,
        "attention.head_count_kv": spec.n_head_kv,
        "attention.layer_norm_epsilon" if "layer_norm" in has else "attention.layer_norm_rms_epsilon": 1e-5,
        "rope.freq_base": 10000.0,
        **KEYS.get(a, {}),
    }
    if spec.head_dim:
        keys.update({"attention.key_length": spec.head_dim, "attention.value_length": spec.head_dim})
    if spec.head_dim_swa:  # rope.dimension_count_swa: else llama.cpp rotates the full layers' width
        keys.update(
            {
                "attention.key_length_swa": spec.head_dim_swa,
                "attention.value_length_swa": spec.head_dim_swa,
                "rope.dimension_count_swa": spec.head_dim_swa,
            }
        )
    if spec.sliding_window is not None:
        keys["attention.sliding_window"] = spec.sliding_window
    if spec.swa_pattern:
        # bools, as the converters write them; llama.cpp reads them into hparams.is_swa_impl
        keys["attention.sliding_window_pattern"] = list(spec.swa_pattern)
    if spec.longrope:
        # attn_factor as Phi-3's converter computes it for a 4x longer context
        scale = 4.0
        keys.update(
            {
                "rope.scaling.type": "longrope",
                "rope.scaling.original_context_length": spec.longrope,
                "rope.scaling.attn_factor": float(np.sqrt(1 + np.log(scale) / np.log(spec.longrope))),
            }
        )
    keys.update(spec.extra)
    for key, value in keys.items():
        _add(w, f"{a}.{key}", value)
    n_vocab = _add_tokenizer(w, tokenizer_from, spec.n_vocab)
    t, ones = _tensor_writers(w, rng, spec.weights)

    def norm(name: str) -> None:
        ones(name + ".weight", spec.n_embd)
        if "norm_bias" in has:
            t(name + ".bias", spec.n_embd)

    t("token_embd.weight", n_vocab, spec.n_embd, scale=0.5)
    if "no_norms" not in has:
        norm("output_norm")
    if "output" in has:
        t("output.weight", n_vocab, spec.n_embd)
    if spec.longrope:
        # one pair for the whole model (llama.cpp duplicates layer 0's); long factors > 1 slow the
        # low frequencies down, as LongRoPE's do
        half = spec.hd // 2
        w.add_tensor("rope_factors_long.weight", np.linspace(1.0, 8.0, half, dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.linspace(1.0, 1.5, half, dtype=np.float32))
    if "rope_freqs" in has:
        half, rotated = spec.hd // 2, spec.hd // 8
        w.add_tensor("rope_freqs.weight", np.array([1.0] * rotated + [1e30] * (half - rotated), dtype=np.float32))
    sliding = spec.swa_pattern or (False,) * spec.n_layer
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        hd = spec.layer_hd(il)
        q, kv = spec.n_head * hd, spec.kv_heads(il) * hd
        if not has & {"no_pre_norms", "no_norms"}:
            norm(p + "attn_norm")
        if "fused_qkv" in has:
            t(p + "attn_qkv.weight", q + 2 * kv, spec.n_embd)
        else:
            t(p + "attn_q.weight", q, spec.n_embd)
            t(p + "attn_k.weight", kv, spec.n_embd)
            if not ("k_eq_v" in has and not sliding[il]):
                t(p + "attn_v.weight", kv, spec.n_embd)
        if "qkv_bias" in has:
            t(p + "attn_q.bias", q)
            t(p + "attn_k.bias", kv)
            t(p + "attn_v.bias", kv)
        if "qk_norm" in has:
            ones(p + "attn_q_norm.weight", hd)
            ones(p + "attn_k_norm.weight", hd)
        if "qk_norm_rows" in has:
            ones(p + "attn_q_norm.weight", q)
            ones(p + "attn_k_norm.weight", kv)
        t(p + "attn_output.weight", spec.n_embd, q)
        if "out_bias" in has:
            t(p + "attn_output.bias", spec.n_embd)
        if "sinks" in has:
            # f32, as ggml_soft_max_add_sinks requires; positive so that the sink soaks up attention
            w.add_tensor(p + "attn_sinks.weight", rng.uniform(0.0, 2.0, spec.n_head).astype(np.float32))
        if has & {"post_norms", "ffn_norm_post_attn"}:
            norm(p + "post_attention_norm")
        if not has & {"no_pre_norms", "no_norms", "parallel", "ffn_norm_post_attn"}:
            norm(p + "ffn_norm")
        if "moe" in has:
            n_exp, n_ff_exp = keys["expert_count"], keys["expert_feed_forward_length"]
            t(p + "ffn_gate_inp.weight", n_exp, spec.n_embd)
            t(p + "ffn_gate_exps.weight", n_exp, n_ff_exp, spec.n_embd)
            t(p + "ffn_up_exps.weight", n_exp, n_ff_exp, spec.n_embd)
            t(p + "ffn_down_exps.weight", n_exp, spec.n_embd, n_ff_exp)
            if "moe_bias" in has:
                t(p + "ffn_gate_inp.bias", n_exp)
                t(p + "ffn_gate_exps.bias", n_exp, n_ff_exp, f32=True)
                t(p + "ffn_up_exps.bias", n_exp, n_ff_exp, f32=True)
                t(p + "ffn_down_exps.bias", n_exp, spec.n_embd, f32=True)
        else:
            if not has & {"no_gate", "fused_up"}:
                t(p + "ffn_gate.weight", spec.n_ff, spec.n_embd)
            t(p + "ffn_up.weight", spec.n_ff * (2 if "fused_up" in has else 1), spec.n_embd)
            t(p + "ffn_down.weight", spec.n_embd, spec.n_ff)
        if "ffn_bias" in has:
            t(p + "ffn_up.bias", spec.n_ff)
            t(p + "ffn_down.bias", spec.n_embd)
        if "post_norms" in has:
            norm(p + "post_ffw_norm")
        if "out_scale" in has:
            w.add_tensor(p + "layer_output_scale.weight", np.array([0.5 + 0.5 * rng.random()], dtype=np.float32))
    _finish(w)
    return path


# Every architecture kvgguf holds, tiny: tests/model/test_archs.py runs each, support.TESTED_ARCHS
# (docs/models.md) lists them, tests/model/test_context_shift.py shifts each.
SPECS = {
    "llama": TinySpec("llama"),
    "qwen2": TinySpec("qwen2"),
    "qwen3": TinySpec("qwen3", head_dim=32),
    "phi3": TinySpec("phi3", sliding_window=2047),  # the window its converter writes and llama.cpp ignores
    "mistral3": TinySpec("mistral3"),
    "granite": TinySpec("granite"),
    "smollm3": TinySpec("smollm3", n_layer=4),  # every 4th layer without rope
    "olmo2": TinySpec("olmo2"),
    "olmo2-swa": TinySpec("olmo2", n_layer=4, sliding_window=32),  # OLMo 3's layout: 3 of 4 layers slide
    "starcoder2": TinySpec("starcoder2"),
    "cohere2": TinySpec("cohere2", n_layer=4),  # sliding window 32, every 4th layer full
    "gemma2": TinySpec("gemma2"),  # soft-capping, sliding window 32 on even layers
    "granite_swa": TinySpec("granite_swa", n_layer=4),  # attention sinks; layer 0 full, 1-3 slide over 32
    "llama-hd96": TinySpec("llama", head_dim=96),  # OpenLLaMA's and some Phi files' head dim
    "llama-hd80": TinySpec("llama", head_dim=80),
    "llama-kv-array": TinySpec("llama", n_head_kv=(2, 2)),  # head_count_kv written per layer
    "llama-longrope": TinySpec("llama", longrope=256),  # n_ctx 1024 > 256: llama.cpp takes the long factors
    "phi3-longrope": TinySpec("phi3", longrope=256),
    "exaone": TinySpec("exaone"),
    "exaone4": TinySpec("exaone4"),  # norms after the blocks only, per-head q/k norms
    "glm4": TinySpec("glm4", extra={"rope.dimension_count": 8}),  # half of each head rotates, as GLM-4's
    "internlm2": TinySpec("internlm2"),
    "stablelm": TinySpec("stablelm", extra={"rope.dimension_count": 4}),  # LayerNorm with biases, 25% rotary
    "command-r": TinySpec("command-r"),  # parallel blocks, logit scale
    "gemma": TinySpec("gemma", head_dim=32),  # Gemma 7B's head dim is no n_embd / n_head either
    "qwen3moe": TinySpec("qwen3moe", head_dim=32),  # 4 experts, 2 used
    "olmo": TinySpec("olmo"),  # LayerNorms without weights
    "gpt-oss": TinySpec("gpt-oss", head_dim=32),  # layer 0 slides over 32, layer 1 full; sinks; MoE
    # Gemma 4 31B's layout, tiny: sliding layers 16-wide heads x 2 KV heads, full ones 32 x 1 with V
    # taken from K's projection (no attn_v); no per-layer embeddings, no shared KV layers
    "gemma4": TinySpec(
        "gemma4", n_layer=4, head_dim=32, head_dim_swa=16, n_head_kv=(2, 1, 2, 1), sliding=(True, False, True, False)
    ),
}

# Architectures kvgguf must refuse (write_refused writes them; tests check the refusal):
#   deepseek2  MLA: llama.cpp caches one K-only latent row per token (kv_lora_rank + rope dims,
#              key_length) for all heads, and no V: nothing kvgguf's K/V rows describe
#   mamba      recurrent: a per-sequence state instead of a KV cache (head_count 0, as its converter writes)
REFUSED = ("deepseek2", "mamba")

# deepseek2's MLA widths: each head's query is qk_nope + qk_rope wide (key_length_mla); the cached
# latent is kv_lora_rank + qk_rope wide (key_length), its first kv_lora_rank values serving as V
MLA_KV_LORA_RANK, MLA_QK_ROPE, MLA_QK_NOPE, MLA_V_HEAD = 32, 16, 16, 16
# mamba: llama.cpp supports only d_inner = 2 * n_embd
SSM_CONV_KERNEL, SSM_STATE, SSM_DT_RANK = 4, 16, 4


def write_refused(path: Path, arch: str, tokenizer_from: Path, seed: int = 0) -> Path:
    """Writes a tiny random-weight GGUF of one of REFUSED's architectures (2 layers, n_embd 64),
    which stock llama.cpp loads and runs; returns its path."""
    import gguf

    if arch not in REFUSED:
        raise ValueError(f"{arch} is not one of {REFUSED}")
    n_layer, n_embd, n_ff = 2, 64, 128
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    keys = {
        "context_length": 4096,
        "embedding_length": n_embd,
        "block_count": n_layer,
        "attention.layer_norm_rms_epsilon": 1e-6,
    }
    if arch == "deepseek2":
        n_head = 4
        keys.update(
            {
                "feed_forward_length": n_ff,
                "attention.head_count": n_head,
                "attention.head_count_kv": 1,  # MLA runs as MQA over the shared latent
                # llama.cpp takes a model as "lite" (no q LoRA) only by its layer count (26, 27, 48) and
                # otherwise requires this key: 0 loads a plain attn_q, as DeepSeek-V2-Lite has
                "attention.q_lora_rank": 0,
                "attention.kv_lora_rank": MLA_KV_LORA_RANK,
                "attention.key_length": MLA_KV_LORA_RANK + MLA_QK_ROPE,
                "attention.value_length": MLA_KV_LORA_RANK,
                "attention.key_length_mla": MLA_QK_NOPE + MLA_QK_ROPE,  # these two make llama.cpp use MLA
                "attention.value_length_mla": MLA_V_HEAD,
                "rope.dimension_count": MLA_QK_ROPE,
                "rope.freq_base": 10000.0,
                "leading_dense_block_count": n_layer,  # every layer a dense FFN: no expert tensors
                # required even without experts (the converter writes intermediate_size and 0 for dense models)
                "expert_feed_forward_length": n_ff,
                "expert_shared_count": 0,
            }
        )
    else:
        d_inner = 2 * n_embd
        keys.update(
            {
                "feed_forward_length": 0,  # its converter writes these zeros
                "attention.head_count": 0,
                "ssm.conv_kernel": SSM_CONV_KERNEL,
                "ssm.inner_size": d_inner,
                "ssm.state_size": SSM_STATE,
                "ssm.time_step_rank": SSM_DT_RANK,
                "ssm.dt_b_c_rms": False,
            }
        )
    for key, value in keys.items():
        _add(w, f"{arch}.{key}", value)
    n_vocab = _add_tokenizer(w, tokenizer_from)
    t, ones = _tensor_writers(w, rng)

    t("token_embd.weight", n_vocab, n_embd, scale=0.5)
    ones("output_norm.weight", n_embd)
    for il in range(n_layer):
        p = f"blk.{il}."
        ones(p + "attn_norm.weight", n_embd)
        if arch == "deepseek2":
            t(p + "attn_q.weight", n_head * (MLA_QK_NOPE + MLA_QK_ROPE), n_embd)
            t(p + "attn_kv_a_mqa.weight", MLA_KV_LORA_RANK + MLA_QK_ROPE, n_embd)
            ones(p + "attn_kv_a_norm.weight", MLA_KV_LORA_RANK)
            # kv_b split per head as the converter does: k_b (transposed) absorbs into q, v_b decompresses V
            t(p + "attn_k_b.weight", n_head, MLA_KV_LORA_RANK, MLA_QK_NOPE)
            t(p + "attn_v_b.weight", n_head, MLA_V_HEAD, MLA_KV_LORA_RANK)
            t(p + "attn_output.weight", n_embd, n_head * MLA_V_HEAD)
            ones(p + "ffn_norm.weight", n_embd)
            t(p + "ffn_gate.weight", n_ff, n_embd)
            t(p + "ffn_up.weight", n_ff, n_embd)
            t(p + "ffn_down.weight", n_embd, n_ff)
        else:
            t(p + "ssm_in.weight", 2 * d_inner, n_embd)  # x and the gate z
            t(p + "ssm_conv1d.weight", d_inner, SSM_CONV_KERNEL, scale=0.3, f32=True)  # f32, as converted
            t(p + "ssm_conv1d.bias", d_inner)
            t(p + "ssm_x.weight", SSM_DT_RANK + 2 * SSM_STATE, d_inner)  # dt, B, C
            t(p + "ssm_dt.weight", d_inner, SSM_DT_RANK, scale=0.3)
            t(p + "ssm_dt.bias", d_inner)
            # A = -exp(A_log) with Mamba's initial A_log = log(1..d_state): negative, so the state decays
            w.add_tensor(p + "ssm_a", -np.tile(np.arange(1, SSM_STATE + 1, dtype=np.float32), (d_inner, 1)))
            ones(p + "ssm_d", d_inner)
            t(p + "ssm_out.weight", n_embd, d_inner)
    _finish(w)
    return path
