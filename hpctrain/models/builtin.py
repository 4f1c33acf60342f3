"""The built-in models' specs, declared beside their code (``gpt.py``, ``vit.py``). Torch-free.

Each is a :class:`hpctrain.models.spec.TransformerSpec` whose fields are the model's keyword arguments:
what input it takes, its tokens per sample, its parameter counts and the parameter shapes the planner reads,
its rules for data and layouts. :data:`BUILTIN` maps each model's ``_target_`` to its spec.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from hpctrain.config.schema import ModelConfig
from hpctrain.config.typed import typed_from
from hpctrain.errors import ConfigError
from hpctrain.models.facts import Ends, MoEShape
from hpctrain.models.spec import ConfiguredSpec, ModelSpec, ParamSpec, TransformerSpec, at_least, config_facts

INT64 = 8  # bytes of a token id (torch.long)
FP32 = 4


@dataclass
class GPTSpec(TransformerSpec):
    """hpctrain.models.gpt.GPT: a GPT-2 style decoder (causal attention, learned positions)."""

    target: str = "hpctrain.models.gpt.GPT"
    vocab_size: int = 256
    seq_len: int = 64
    tie_embeddings: bool = True
    input_kind: ClassVar[str | None] = "tokens"
    context_parallel: ClassVar[bool] = True  # GPT.CONTEXT_PLAN
    lora_targets: ClassVar[tuple[str, ...]] = ("attn.q", "attn.v")  # GPT.LORA_TARGETS

    @property
    def tokens_per_sample(self) -> int:
        return int(self.seq_len)

    @property
    def context_length(self) -> int:
        return int(self.seq_len)

    def synthetic_dataset(self, num_samples: int, seed: int) -> Any:
        from hpctrain.models.synthetic import SyntheticTokens

        return SyntheticTokens(num_samples, self.seq_len, self.vocab_size, seed)

    @property
    def tied_embeddings(self) -> bool:
        return bool(self.tie_embeddings)

    @property
    def throughput_unit(self) -> str:
        return "tokens"

    def ends(self) -> Ends:
        """Token ids in (int64, looked up: the learned positions' lookup saves its ids once per forward), a
        vocabulary-split embedding and head under TP, logits for every position out."""
        return Ends(
            input_numel=self.seq_len,
            input_itemsize=INT64,
            input_float=False,
            input_fixed_bytes=self.seq_len * INT64,
            head_positions=self.seq_len,
            head_width=self.vocab_size,
            norm_gathers_sequence=False,
            vocab_parallel=True,
        )

    def example_batch(self, samples: int, generator: Any, torch: Any) -> tuple[Any, Any]:
        idx = torch.randint(0, self.vocab_size, (samples, self.seq_len + 1), generator=generator)
        return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

    def describe(self) -> str:
        tied = ", tied embeddings" if self.tie_embeddings else ""
        return (
            f"{self.n_layers} layers, d_model {self.d_model}, {self.n_heads} heads, seq {self.seq_len}, "
            f"vocab {self.vocab_size}{tied}"
        )

    def check(self) -> None:
        super().check()
        at_least("model.vocab_size", self.vocab_size, 2)
        at_least("model.seq_len", self.seq_len, 1)

    def check_layout(self, degrees: Any, parallel: Any, n_stages: int) -> None:
        super().check_layout(degrees, parallel, n_stages)
        if self.vocab_size % degrees.tp:
            raise ConfigError(
                "model.vocab_size",
                self.vocab_size,
                f"the embedding and LM head split the vocabulary over parallel.tp={degrees.tp} "
                f"({self.vocab_size} % {degrees.tp} = {self.vocab_size % degrees.tp})",
                valid=f"a multiple of {degrees.tp}",
            )

    def input_params(self) -> tuple[ParamSpec, ...]:
        """What the first pipeline stage keeps (``PIPELINE_INPUT``), as the planner sees it: the token
        embedding is split over the vocabulary under TP; tied, it is also the LM head's weight (a linear
        input)."""
        d = self.d_model
        return (
            ParamSpec("tok_emb.weight", (self.vocab_size, d), 0, self.tie_embeddings, vocab_lookup=True),
            ParamSpec("pos_emb.weight", (self.seq_len, d)),
        )

    def output_params(self) -> tuple[ParamSpec, ...]:
        """What the last stage keeps (``PIPELINE_OUTPUT``): the final norm and the head (none of its own when
        tied to the token embedding)."""
        d = self.d_model
        norm = (ParamSpec("norm.weight", (d,)), ParamSpec("norm.bias", (d,)))
        return (
            norm if self.tie_embeddings else (*norm, ParamSpec("head.weight", (self.vocab_size, d), 0, True))
        )

    def output_copies(self) -> tuple[ParamSpec, ...]:
        """What the last pipeline stage holds besides ``output_params`` when it is not the first: its own copy
        of the tied embedding for the LM head (Megatron's embedding group, hpctrain.parallel.shared)."""
        if not self.tie_embeddings:
            return ()
        return (ParamSpec("head.weight", (self.vocab_size, self.d_model), 0, True),)

    def check_data(self, name: str, image_shape: tuple[int, ...] | None, vocab: int | None) -> None:
        if vocab is not None and vocab > self.vocab_size:
            raise ConfigError(
                "model.vocab_size",
                self.vocab_size,
                f"data={name} has a vocabulary of {vocab} tokens",
                valid=f"≥ {vocab}",
            )

    def param_count(self, include_embeddings: bool = True) -> int:
        """Distinct trainable parameters (tied weights once). Without embeddings: the N of 6·N, those in
        matmuls: the LM head counts even when tied (its d·V matmul runs either way, as in nanoGPT's MFU)."""
        d = self.d_model
        dense = self.n_layers * self.block_params() + 2 * d  # blocks + final norm
        head = d * self.vocab_size
        if not include_embeddings:
            return dense + head
        embeddings = self.vocab_size * d + self.seq_len * d
        return embeddings + dense + (0 if self.tie_embeddings else head)


@dataclass
class MoESpec:
    """``model.moe``: the mixture of experts in every block of :class:`GPTMoESpec`'s model."""

    experts: int = 4
    top_k: int = 2
    capacity: float = 0.0  # 0: dropless; else each expert keeps ⌈capacity · top_k · tokens / experts⌉
    aux_loss_weight: float = 0.01  # Switch Transformer's load-balancing loss coefficient (Fedus et al. 2022)


@dataclass
class GPTMoESpec(GPTSpec):
    """hpctrain.models.gpt.GPTMoE: GPT with a mixture of experts (hpctrain.models.moe.MoE) in place of every
    MLP: ``model.moe.experts`` experts of the MLP's shape, each token routed to ``top_k`` of them."""

    target: str = "hpctrain.models.gpt.GPTMoE"
    moe: MoESpec = dataclasses.field(default_factory=MoESpec)

    def __post_init__(self) -> None:
        if isinstance(self.moe, dict):  # the model group's keyword arguments
            self.moe = typed_from(MoESpec, self.moe, "model.moe")

    @property
    def experts(self) -> int:
        return int(self.moe.experts)

    def check(self) -> None:
        super().check()
        m = self.moe
        at_least("model.moe.experts", m.experts, 1)
        at_least("model.moe.top_k", m.top_k, 1)
        if m.top_k > m.experts:
            raise ConfigError(
                "model.moe.top_k",
                m.top_k,
                f"routes each token to more than the {m.experts} experts",
                valid=f"1 … {m.experts}",
            )
        if not m.capacity >= 0:
            raise ConfigError(
                "model.moe.capacity",
                m.capacity,
                "must be ≥ 0",
                valid="0 (dropless), or a capacity factor such as 1.25",
            )
        if not m.aux_loss_weight >= 0:
            raise ConfigError(
                "model.moe.aux_loss_weight", m.aux_loss_weight, "must be ≥ 0", valid="e.g. 0.01"
            )

    def describe(self) -> str:
        m = self.moe
        dropping = f", capacity {m.capacity:g}" if m.capacity else ", dropless"
        return f"{super().describe()}, {m.experts} experts top-{m.top_k}{dropping}"

    def mlp_param_specs(self) -> tuple[ParamSpec, ...]:
        """The router (replicated) and the experts' grouped weights (split over ep along the experts; whole
        under tensor parallelism, which runs the mixture on the gathered sequence)."""
        d, hidden, e = self.d_model, self.d_model * self.mlp_ratio, self.experts
        share = self.moe.top_k / e
        return (
            ParamSpec("mlp.router.weight", (e, d), None, True),
            ParamSpec("mlp.experts.w_in", (e, d, hidden), None, True, ep_dim=0, active=share),
            ParamSpec("mlp.experts.b_in", (e, hidden), None, False, ep_dim=0, active=share),
            ParamSpec("mlp.experts.w_out", (e, hidden, d), None, True, ep_dim=0, active=share),
            ParamSpec("mlp.experts.b_out", (e, d), None, False, ep_dim=0, active=share),
        )

    def mlp_params(self) -> int:
        return self.d_model * self.experts + self.experts * super().mlp_params()

    def active_mlp_params(self) -> int:
        return self.d_model * self.experts + self.moe.top_k * super().mlp_params()

    def moe_shape(self) -> MoEShape:
        return MoEShape(self.experts, self.moe.top_k, self.moe.capacity)


@dataclass
class ViTSpec(TransformerSpec):
    """hpctrain.models.vit.ViT: a Vision Transformer (patch embedding, class token)."""

    target: str = "hpctrain.models.vit.ViT"
    image_size: int = 8
    patch_size: int = 2
    in_channels: int = 1
    num_classes: int = 10
    input_kind: ClassVar[str | None] = "images"

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_sample(self) -> int:
        return self.n_patches + 1  # the class token

    def synthetic_dataset(self, num_samples: int, seed: int) -> Any:
        from hpctrain.models.synthetic import SyntheticImages

        size = self.image_size
        return SyntheticImages(num_samples, self.in_channels, size, size, self.num_classes, seed)

    def ends(self) -> Ends:
        """fp32 images in (the patch convolution saves its 16-bit copy under autocast and FSDP's mixed
        precision), one row of class logits per sample out: the head reads the class token, so the final
        norm gathers the sequence under sequence parallelism (``ViT.TP_PLAN``)."""
        return Ends(
            input_numel=self.in_channels * self.image_size**2,
            input_itemsize=FP32,
            input_float=True,
            input_fixed_bytes=0,
            head_positions=1,
            head_width=self.num_classes,
            norm_gathers_sequence=True,
            vocab_parallel=False,
        )

    def example_batch(self, samples: int, generator: Any, torch: Any) -> tuple[Any, Any]:
        size = (samples, self.in_channels, self.image_size, self.image_size)
        images = torch.randn(*size, generator=generator)
        return images, torch.randint(0, self.num_classes, (samples,), generator=generator)

    def describe(self) -> str:
        return (
            f"{self.n_layers} layers, d_model {self.d_model}, {self.n_heads} heads, "
            f"{self.image_size}² images in {self.patch_size}² patches ({self.tokens_per_sample} tokens)"
        )

    def check(self) -> None:
        super().check()
        for name in ("image_size", "patch_size", "in_channels", "num_classes"):
            at_least(f"model.{name}", getattr(self, name), 1)
        if self.image_size % self.patch_size:
            raise ConfigError(
                "model.patch_size", self.patch_size, f"must divide model.image_size={self.image_size}"
            )

    def input_params(self) -> tuple[ParamSpec, ...]:
        """What the first pipeline stage keeps (``PIPELINE_INPUT``): the patch projection, class token and
        positions."""
        d = self.d_model
        return (
            ParamSpec(
                "patch_emb.weight", (d, self.in_channels, self.patch_size, self.patch_size), None, True
            ),
            ParamSpec("patch_emb.bias", (d,), None, True),
            ParamSpec("cls_token", (1, 1, d)),
            ParamSpec("pos_emb", (1, self.n_patches + 1, d)),
        )

    def output_params(self) -> tuple[ParamSpec, ...]:
        """What the last stage keeps (``PIPELINE_OUTPUT``): the final norm and the classification head."""
        d = self.d_model
        return (
            ParamSpec("norm.weight", (d,)),
            ParamSpec("norm.bias", (d,)),
            ParamSpec("head.weight", (self.num_classes, d), None, True),
            ParamSpec("head.bias", (self.num_classes,), None, True),
        )

    def check_data(self, name: str, image_shape: tuple[int, ...] | None, vocab: int | None) -> None:
        if image_shape is None:
            return
        channels, height, width, classes = image_shape
        for key, have, want in (
            ("image_size", self.image_size, height),
            ("in_channels", self.in_channels, channels),
            ("num_classes", self.num_classes, classes),
        ):
            if have != want:
                raise ConfigError(
                    f"model.{key}",
                    have,
                    f"data={name} gives {channels}×{height}×{width} images in {classes} classes",
                    valid=str(want),
                )

    def param_count(self, include_embeddings: bool = True) -> int:
        """As GPT's; the "embeddings" are the additive class token and positions, the patch projection
        is dense."""
        d = self.d_model
        patch_proj = self.in_channels * self.patch_size**2 * d + d
        head = d * self.num_classes + self.num_classes
        dense = patch_proj + self.n_layers * self.block_params() + 2 * d + head
        return dense + (d + (self.n_patches + 1) * d if include_embeddings else 0)


# The built-in models' specs, by the ``_target_`` that builds them.
BUILTIN: dict[str, type[TransformerSpec]] = {
    "hpctrain.models.gpt.GPT": GPTSpec,
    "hpctrain.models.gpt.GPTMoE": GPTMoESpec,
    "hpctrain.models.vit.ViT": ViTSpec,
}


def model_spec(model: ModelConfig | ModelSpec) -> ModelSpec:
    """The spec of ``model``: declared for a built-in target (its arguments checked), else unknown facts."""
    if isinstance(model, ModelSpec):
        return model
    spec_type = BUILTIN.get(model.target)
    if spec_type is None:
        context, vocab = config_facts(model.args)
        if context is None and vocab is None:
            return ModelSpec(target=model.target)
        return ConfiguredSpec(target=model.target, context=context, vocab=vocab)
    fields = [f.name for f in dataclasses.fields(spec_type) if f.name != "target"]
    for key, value in model.args.items():
        if key not in fields:
            raise ConfigError(
                f"model.{key}", value, f"not an argument of {model.target}", valid=", ".join(fields)
            )
    spec = typed_from(spec_type, model.args, "model")
    spec.check()
    return spec
