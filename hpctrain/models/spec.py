"""What the core knows about a model without building it: its spec. Torch-free (used on the submit path).

A run's model is a ``_target_`` and its arguments (:class:`hpctrain.config.schema.ModelConfig`);
:func:`model_spec` turns it into a spec. The built-in models declare theirs here, beside their code: the
input they take, the tokens per sample, parameter and FLOP counts, that they carry tensor- and
pipeline-parallel plans, and the shapes the planner reads. Any other model gets a :class:`ModelSpec` whose
facts are unknown until the model is built (:mod:`hpctrain.submit.probe` builds it on the meta device); the
trainer then derives what it needs from the built module. The core reads these facts; it never asks which
model it trains.

Over 400 lines: the spec protocol and the transformer spec the built-ins share (its parameter, FLOP and
activation counts, the layout rules for tp, pp, cp and ep) are read together: the planner's numbers and the
refusals before submit come from the same lines.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from hpctrain.config.schema import ModelConfig
from hpctrain.errors import ConfigError
from hpctrain.models.facts import Ends, ModelFacts, MoEShape, ParamFact, TransformerShape

Shape = tuple[int, ...] | None  # a built-in dataset's fixed (C, H, W, classes), if it has one


@dataclass(frozen=True)
class ParamSpec:
    """One parameter tensor of a built-in model as declared (its sheet entry: :class:`ParamFact`)."""

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None = (
        None  # the dimension tensor parallelism shards (hpctrain.parallel.tp), None: replicated
    )
    autocast_copy: bool = False  # an input of a linear or conv: autocast caches a 16-bit copy for the step
    vocab_lookup: bool = False  # an embedding looked up by vocabulary-split ids under TP (see ParamFact)
    ep_dim: int | None = None  # an expert's grouped weight: the dimension expert parallelism splits
    active: float = 1.0  # the share of a token's computation that uses it (experts: top_k / experts)


@dataclass(frozen=True)
class PipelineSplit:
    """How a model of the shape embed → repeated blocks → head runs as pipeline stages: the ``input``
    modules run in order on the first stage, the children of the ``blocks`` container are divided among the
    stages, the ``output`` modules run in order on the last. ``keep``: parameter-free modules every stage
    keeps (a rotary table). ``block_kwargs(model, hidden)``: what each block takes beside the hidden states
    (a transformers decoder layer's position embeddings and causal mask); None: blocks take only them."""

    input: tuple[str, ...]
    blocks: str
    output: tuple[str, ...]
    keep: tuple[str, ...] = ()
    block_kwargs: Callable[[Any, Any], dict[str, Any]] | None = None

    def modules(self) -> tuple[str, ...]:
        return (*self.input, self.blocks, *self.output, *self.keep)


@dataclass
class ModelSpec:
    """Facts of a model that declares none: a user's ``_target_``. Everything is unknown (None/False)."""

    target: str = ""
    input_kind: ClassVar[str | None] = None  # "tokens" (int ids [B, T]) | "images" (float [B, C, H, W])
    transformer: ClassVar[bool] = False  # the planner's shapes (n_layers, d_model, ...) are declared
    # The modules LoRA adapts when model.lora.targets names none (the model class's LORA_TARGETS).
    lora_targets: ClassVar[tuple[str, ...]] = ()

    @property
    def name(self) -> str:
        return self.target.rsplit(".", 1)[-1]

    def declared_shapes(self) -> TransformerSpec | None:
        """This spec as the planner reads it (layers, widths, heads: a fact sheet), or None for a model that
        declares no shapes (a user's ``_target_``, whose facts are measured instead)."""
        return None

    @property
    def tokens_per_sample(self) -> int:
        """Positions per sample the blocks see; 1 when unknown (throughput is then in samples)."""
        return 1

    @property
    def throughput_unit(self) -> str:
        """What a run's rate is counted in beside samples: "tokens" for a language model, else "samples"."""
        return "samples"

    @property
    def tied_embeddings(self) -> bool:
        return False

    def check(self) -> None:
        """Raise a one-line ConfigError for arguments that cannot build this model."""

    def describe(self) -> str:
        """The model's shape in a few words, for plans and logs."""
        return self.target

    def to_model_config(self) -> ModelConfig:
        """The ``model`` group's ``_target_`` + arguments that build this spec's model."""
        fields = [f.name for f in dataclasses.fields(self) if f.name != "target"]
        args = {name: getattr(self, name) for name in fields}
        # A nested group of arguments (model.moe) as the mapping the config gives.
        args = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in args.items()}
        return ModelConfig(target=self.target, args=args)

    def param_count(self, include_embeddings: bool = True) -> int | None:
        return None

    def flops_per_token(self) -> float | None:
        return None

    def check_layout(self, degrees: Any, parallel: Any, n_stages: int) -> None:
        """Raise a one-line ConfigError if this model cannot be split as ``degrees`` (a RunShape's) say. A
        model of unknown facts is checked when built (:mod:`hpctrain.submit.probe`): whether it has a
        tensor-parallel plan and a pipeline split."""

    def accepts(self, gives: str) -> bool:
        """Whether data that yields ``gives`` (an input kind, or "any": shaped by the model) can feed this
        model. A model of unknown input is tried on a real batch instead (:mod:`hpctrain.submit.probe`)."""
        return self.input_kind is None or gives in ("any", self.input_kind)

    def check_data(self, name: str, image_shape: tuple[int, ...] | None, vocab: int | None) -> None:
        """Raise a one-line ConfigError if built-in dataset ``name`` (of the kind this model accepts), with
        its fixed image shape or vocabulary, cannot feed this model."""

    @property
    def per_token(self) -> bool:
        """Throughput is counted in tokens (the model takes token ids), else in samples."""
        return self.throughput_unit != "samples"

    @property
    def context_length(self) -> int | None:
        """The length of the token windows the model takes (None: it takes no token windows, or says not)."""
        return None

    def synthetic_dataset(self, num_samples: int, seed: int) -> Any:
        """``data=synthetic``: random samples shaped as this model takes them; a ConfigError for a model
        that declares no input."""
        raise ConfigError(
            "data",
            "synthetic",
            f"is shaped by the model's declared input; model {self.name} declares none",
            valid="a dataset of your own: data._target_=...",
        )


@dataclass
class TransformerSpec(ModelSpec):
    """A built-in pre-norm transformer (hpctrain.models.layers.Block)."""

    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    transformer: ClassVar[bool] = True
    # Its attention is causal scaled_dot_product_attention inside the blocks, and it declares where the
    # residual stream starts (the class's CONTEXT_PLAN): context parallelism can split its sequence.
    context_parallel: ClassVar[bool] = False

    @property
    def experts(self) -> int:
        """Experts of each mixture-of-experts layer (0: dense)."""
        return 0

    def declared_shapes(self) -> TransformerSpec:
        return self

    def check(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "mlp_ratio"):
            at_least(f"model.{name}", getattr(self, name), 1)
        if self.d_model % self.n_heads:
            raise ConfigError(
                "model.n_heads",
                self.n_heads,
                f"must divide model.d_model={self.d_model} "
                f"({self.d_model} % {self.n_heads} = {self.d_model % self.n_heads})",
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("model.dropout", self.dropout, "must be in [0, 1)")

    def check_layout(self, degrees: Any, parallel: Any, n_stages: int) -> None:
        """Megatron splits divide heads and MLP units over tp; a pipeline divides the layers into stages.
        Any sequence length splits over tp (hpctrain.parallel.tp pads it). Context parallelism splits the
        sequence into 2·cp equal chunks (each rank one from each end: causal load balancing), and expert
        parallelism the experts into ep equal groups."""
        tp = degrees.tp
        splits = [("n_heads", self.n_heads, "attention heads")]
        if not self.experts:  # a mixture of experts runs whole under tensor parallelism
            hidden = self.d_model * self.mlp_ratio
            splits.append(("d_model", hidden, "MLP hidden units (d_model × mlp_ratio)"))
        self._check_context(degrees.cp)
        self._check_experts(degrees.ep)
        for key, value, what in splits:
            if value % tp:
                raise ConfigError(
                    f"model.{key}",
                    getattr(self, key),
                    f"{value} {what} do not split over parallel.tp={tp} ({value} % {tp} = {value % tp})",
                )
        if degrees.pp > 1 and self.n_layers % n_stages:
            raise ConfigError(
                "model.n_layers",
                self.n_layers,
                f"not divisible by the {n_stages} pipeline stages (parallel.pp={degrees.pp} × "
                f"{n_stages // degrees.pp} per rank; "
                f"{self.n_layers} % {n_stages} = {self.n_layers % n_stages})",
                valid=f"a multiple of {n_stages}",
            )

    def _check_context(self, cp: int) -> None:
        if cp <= 1:
            return
        if not self.context_parallel:
            raise ConfigError(
                "parallel.cp",
                cp,
                f"model {self.name} declares no attention context parallelism can split "
                "(a causal scaled_dot_product_attention and where its residual stream starts: CONTEXT_PLAN)",
                valid="1, or a model that declares it (gpt, gpt_moe, a transformers decoder)",
            )
        chunks = 2 * cp
        if self.tokens_per_sample % chunks:
            # Padding would leave the ranks' shares with different numbers of real tokens, and each rank's
            # loss is the mean over its own: their mean would no longer be the sequence's.
            raise ConfigError(
                "model.seq_len",
                self.tokens_per_sample,
                f"parallel.cp={cp} splits each sequence into 2·cp = {chunks} equal chunks (causal load "
                f"balancing; {self.tokens_per_sample} % {chunks} = {self.tokens_per_sample % chunks})",
                valid=f"a multiple of {chunks}",
            )
        if self.dropout > 0:
            raise ConfigError(
                "model.dropout",
                self.dropout,
                f"ring attention under parallel.cp={cp} takes no attention dropout",
                valid="0.0 with context parallelism",
            )

    def _check_experts(self, ep: int) -> None:
        if ep <= 1:
            return
        if not self.experts:
            raise ConfigError(
                "parallel.ep",
                ep,
                f"model {self.name} has no experts to place on ranks",
                valid="1, or a mixture-of-experts model (model=gpt_moe)",
            )
        if self.experts % ep:
            raise ConfigError(
                "parallel.ep",
                ep,
                f"does not divide the model's {self.experts} experts "
                f"({self.experts} % {ep} = {self.experts % ep})",
                valid=", ".join(str(k) for k in range(1, self.experts + 1) if self.experts % k == 0),
            )

    def mlp_param_specs(self) -> tuple[ParamSpec, ...]:
        """The block's MLP: fc_in split column-wise (with its bias), fc_out row-wise (bias replicated)."""
        d, hidden = self.d_model, self.d_model * self.mlp_ratio
        return (
            ParamSpec("mlp.fc_in.weight", (hidden, d), 0, True),
            ParamSpec("mlp.fc_in.bias", (hidden,), 0, True),
            ParamSpec("mlp.fc_out.weight", (d, hidden), 1, True),
            ParamSpec("mlp.fc_out.bias", (d,), None, True),
        )

    def mlp_params(self) -> int:
        d, hidden = self.d_model, self.mlp_ratio * self.d_model
        return (d * hidden + hidden) + (hidden * d + d)

    def active_mlp_params(self) -> int:
        """The MLP's parameters one token uses."""
        return self.mlp_params()

    def block_param_specs(self) -> tuple[ParamSpec, ...]:
        """One ``hpctrain.models.layers.Block``: q/k/v and fc_in split by output (column-wise, with their
        biases), o and fc_out by input (row-wise, bias replicated); the LayerNorms are replicated."""
        d = self.d_model
        specs = [ParamSpec("ln1.weight", (d,)), ParamSpec("ln1.bias", (d,))]
        for name in ("q", "k", "v"):
            specs += [
                ParamSpec(f"attn.{name}.weight", (d, d), 0, True),
                ParamSpec(f"attn.{name}.bias", (d,), 0, True),
            ]
        specs += [ParamSpec("attn.o.weight", (d, d), 1, True), ParamSpec("attn.o.bias", (d,), None, True)]
        specs += [ParamSpec("ln2.weight", (d,)), ParamSpec("ln2.bias", (d,))]
        return (*specs, *self.mlp_param_specs())

    def block_params(self) -> int:
        """One pre-norm block: two LayerNorms, q/k/v/o with biases, and the MLP (fc_in/fc_out with biases,
        or a mixture of experts)."""
        d = self.d_model
        return 2 * (2 * d) + 4 * (d * d + d) + self.mlp_params()

    def active_block_params(self) -> int:
        """What one token uses of a block."""
        return self.block_params() - self.mlp_params() + self.active_mlp_params()

    def flops_per_token(self) -> float:
        """Training FLOPs (forward + backward) per token: ``6·N + 12·L·H·Q·T``.

        Chowdhery et al. 2022, "PaLM", appendix B: N non-embedding parameters (``param_count(False)``; of a
        mixture of experts the active ones, those a token uses: the router and top_k experts, as Mixtral's
        "active parameters"), L layers, H heads, Q the head dimension, T tokens per sample. The attention
        term is not halved for causal masking, following the paper."""
        n = self.param_count(include_embeddings=False) - self.n_layers * (
            self.block_params() - self.active_block_params()
        )
        head_dim = self.d_model // self.n_heads
        return float(6 * n + 12 * self.n_layers * self.n_heads * head_dim * self.tokens_per_sample)

    def param_count(self, include_embeddings: bool = True) -> int:
        raise NotImplementedError

    def input_params(self) -> tuple[ParamSpec, ...]:
        raise NotImplementedError

    def example_batch(self, samples: int, generator: Any, torch: Any) -> tuple[Any, Any]:
        """Random ``(inputs, targets)`` of ``samples`` the model takes, made with the caller's ``torch``
        module (this module stays torch-free: the submit path imports it)."""
        raise NotImplementedError

    def output_params(self) -> tuple[ParamSpec, ...]:
        raise NotImplementedError

    def output_copies(self) -> tuple[ParamSpec, ...]:
        """Copies of first-stage weights the last pipeline stage also holds (weights tied across stages)."""
        return ()

    def ends(self) -> Ends:
        """What the model's input and output keep for the backward (the planner's activations)."""
        raise NotImplementedError

    def moe_shape(self) -> MoEShape | None:
        """A mixture of experts in place of every MLP (None: dense)."""
        return None

    def facts(self, n_stages: int = 1) -> ModelFacts:
        """The planner's fact sheet of this model run as ``n_stages`` pipeline stages: every parameter
        tensor (fp32), block ``k`` the FSDP unit ``k`` on stage ⌊k / (n_layers / n_stages)⌋ (the layers
        split evenly, :mod:`hpctrain.parallel.pipeline`), the input parameters on the first stage, the output
        parameters on the last, which under a pipeline also holds its copies of tied weights; the
        activations from the declared shapes."""
        first, last = (0,), (n_stages - 1,)
        per_stage = self.n_layers // n_stages
        # A vocabulary-split lookup's gradient is whole under TP, unless the head tied to it on the same
        # stage computes its split gradient first (the embedding's is added into it).
        same_stage_head = self.tied_embeddings and n_stages == 1

        def fact(
            spec: ParamSpec, name: str, unit: int, stages: tuple[int, ...], copy: bool = False
        ) -> ParamFact:
            whole = spec.vocab_lookup and not same_stage_head
            return ParamFact(
                name,
                spec.shape,
                4,
                unit,
                spec.tp_dim,
                stages,
                spec.autocast_copy,
                whole,
                copy,
                spec.ep_dim,
                spec.active,
            )

        params = [fact(s, s.name, -1, first) for s in self.input_params()]
        for k in range(self.n_layers):
            # Layers beyond an even split are on no stage (the layout check refuses such a split).
            stages = (k // per_stage,) if per_stage and k // per_stage < n_stages else ()
            params += [fact(s, f"layers.{k}.{s.name}", k, stages) for s in self.block_param_specs()]
        params += [fact(s, s.name, -1, last) for s in self.output_params()]
        if n_stages > 1:
            params += [fact(s, s.name, -1, last, copy=True) for s in self.output_copies()]
        return ModelFacts(
            target=self.target,
            params=tuple(params),
            buffer_bytes=0,
            blocks=self.n_layers,
            tokens_per_sample=self.tokens_per_sample,
            activations=TransformerShape(
                self.n_layers,
                self.d_model,
                self.n_heads,
                self.mlp_ratio,
                self.dropout,
                self.ends(),
                self.moe_shape(),
            ),
            throughput_unit=self.throughput_unit,
            flops_per_token=self.flops_per_token(),
            matrix_width=self.d_model,
        )


@dataclass
class ConfiguredSpec(ModelSpec):
    """A model of the user's that declares no facts but whose config says two (a transformers model: its
    ``config`` node, or the ``config.json`` of the save_pretrained folder it is built from): the length of
    the token windows it takes and its vocabulary. hpctrain's text and token data can feed it."""

    context: int | None = None
    vocab: int | None = None

    @property
    def context_length(self) -> int | None:
        return self.context

    def to_model_config(self) -> ModelConfig:
        return ModelConfig(target=self.target, args={})

    def check_data(self, name: str, image_shape: tuple[int, ...] | None, vocab: int | None) -> None:
        if self.vocab is not None and vocab is not None and vocab > self.vocab:
            raise ConfigError(
                "data",
                name,
                f"gives token ids up to {vocab - 1} but model {self.name}'s vocabulary has {self.vocab}",
                valid=f"a tokenizer of at most {self.vocab} ids, or a larger vocab_size",
            )


CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "n_ctx", "seq_length")  # transformers' names


def config_facts(args: dict[str, Any]) -> tuple[int | None, int | None]:
    """(context length, vocabulary) of a model's ``config`` argument: a mapping of a transformers config
    (``n_positions`` / ``max_position_embeddings``, ``vocab_size``), or a node reading a save_pretrained
    folder (``pretrained_model_name_or_path``: its ``config.json``). (None, None) when it says neither."""
    import json
    from pathlib import Path

    node = args.get("config")
    if not isinstance(node, dict):
        return None, None
    folder = node.get("pretrained_model_name_or_path")
    if isinstance(folder, str) and (Path(folder) / "config.json").is_file():
        try:
            node = {**json.loads((Path(folder) / "config.json").read_text()), **node}
        except (OSError, ValueError):
            return None, None
    context = next((node[k] for k in CONTEXT_KEYS if isinstance(node.get(k), int) and node[k] > 0), None)
    vocab = node.get("vocab_size") if isinstance(node.get("vocab_size"), int) else None
    return context, vocab


def at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise ConfigError(key, value, f"must be ≥ {low}")
