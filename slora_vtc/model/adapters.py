"""Which LoRA adapters a server or run has, and where each sits in the unified pool (torch-free).

An adapter is a PEFT folder (`adapter_config.json` + `adapter_model.safetensors`, given as
`--lora NAME=PATH`) or a dummy adapter with seeded random weights (`--dummy-adapters N`, named
dummy-0 .. dummy-N-1). Only adapters in the table are ever served: a request naming any other
adapter is refused, never given invented weights.

Pool layout of one adapter (docs/design.md, "LoRA adapters in the pool"): for each target module in
TARGETS order, `rank` rows; row i holds A[i, :] in the K buffers and B[:, i] in the V buffers and
spans `per_row` slots, enough for the longer of the module's input and output. So an adapter takes
sum over its targets of rank * per_row slots: a rank-16 adapter twice a rank-8 one's, an
attention+MLP adapter more than an attention-only one.
"""

import math
from dataclasses import dataclass, field
from pathlib import Path

from slora_vtc.errors import UserError
from slora_vtc.model.spec import Config, ModelSpec, read_json_object

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION = TARGETS[:4]
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
DUMMY_PREFIX = "dummy-"
# adapter_config.json fields that change the math in ways we do not implement: refused by name
UNSUPPORTED = {
    "use_dora": False,
    "fan_in_fan_out": False,
    "modules_to_save": None,
    "layers_to_transform": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "bias": "none",
    "layer_replication": None,
    "lora_bias": False,
    "exclude_modules": None,
    "target_parameters": None,
    "trainable_token_indices": None,
    "alora_invocation_tokens": None,
}


def module_dims(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in, out) of every module an adapter may target."""
    h, q, kv, i = spec.hidden_size, spec.q_width, spec.kv_width, spec.intermediate_size
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def slots_per_row(spec: ModelSpec, target: str) -> int:
    """Pool slots (kv_width elements each) one row of `target` spans."""
    return math.ceil(max(module_dims(spec)[target]) / spec.kv_width)


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    rank: int
    alpha: float
    targets: tuple[str, ...] = ATTENTION
    use_rslora: bool = False
    path: str | None = None  # a PEFT folder; None: dummy weights seeded by the name

    @property
    def scale(self) -> float:
        """PEFT's scaling: lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    def layout(self, spec: ModelSpec) -> dict[str, tuple[int, int]]:
        """target -> (index of its first row's first slot among the adapter's slots, slots per row)."""
        out, start = {}, 0
        for target in (t for t in TARGETS if t in self.targets):
            per_row = slots_per_row(spec, target)
            out[target] = (start, per_row)
            start += self.rank * per_row
        return out

    def slots(self, spec: ModelSpec) -> int:
        return sum(self.rank * per_row for _, per_row in self.layout(spec).values())


@dataclass(frozen=True)
class AdapterTable:
    """The adapters a server or run may use, by name."""

    adapters: tuple[AdapterSpec, ...] = ()
    by_name: dict[str, AdapterSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "by_name", {a.name: a for a in self.adapters})

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def __bool__(self) -> bool:
        return bool(self.adapters)

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.adapters]

    def get(self, name: str) -> AdapterSpec:
        if name not in self.by_name:
            known = ", ".join(self.names) or "none: give --lora NAME=PATH or --dummy-adapters N"
            raise UserError(f"unknown LoRA adapter '{name}' (known: {known})")
        return self.by_name[name]

    def sizes(self, spec: ModelSpec) -> tuple[tuple[str, int], ...]:
        """(name, pool slots) of every adapter, for EngineConfig.adapter_sizes."""
        return tuple((a.name, a.slots(spec)) for a in self.adapters)

    def check_fits(self, spec: ModelSpec, pool_tokens: int) -> None:
        for a in self.adapters:
            if a.slots(spec) >= pool_tokens:
                raise UserError(
                    f"LoRA adapter '{a.name}' (rank {a.rank}, {len(a.targets)} modules) takes {a.slots(spec)} "
                    f"pool slots, which does not fit a pool of {pool_tokens} tokens"
                )


def adapter_table(lora: list[str] | None = None, dummy: int = 0, dummy_rank: int = 8) -> AdapterTable:
    """The table from `--lora NAME=PATH` values (PEFT folders) and `--dummy-adapters N` of rank `dummy_rank`."""
    if dummy < 0 or dummy_rank <= 0:
        raise UserError(
            f"--dummy-adapters must not be negative and --adapter-rank must be positive (got {dummy} and {dummy_rank})"
        )
    real = [read_peft_adapter(*_name_and_path(value)) for value in lora or []]
    dummies = [AdapterSpec(f"{DUMMY_PREFIX}{i}", dummy_rank, float(dummy_rank)) for i in range(dummy)]
    names = [a.name for a in real + dummies]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"--lora: adapter name '{twice[0]}' is given twice")
    return AdapterTable(tuple(real + dummies))


def _name_and_path(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise UserError(f"--lora takes NAME=PATH (a PEFT adapter folder), got '{value}'")
    return name, path


def read_peft_adapter(name: str, folder: str | Path) -> AdapterSpec:
    """An adapter's spec from its PEFT folder; every setting we cannot serve exactly is refused by name."""
    folder = Path(folder)
    path = folder / CONFIG_FILE
    if not folder.is_dir():
        raise UserError(f"--lora {name}={folder}: not a folder")
    if not path.is_file():
        raise UserError(f"{folder}: no {CONFIG_FILE} (a PEFT adapter folder holds {CONFIG_FILE} and {WEIGHTS_FILE})")
    if not (folder / WEIGHTS_FILE).is_file():
        raise UserError(f"{folder}: no {WEIGHTS_FILE} (only safetensors adapter weights are read)")
    cfg = Config(path, read_json_object(path))
    if cfg.str("peft_type", "LORA") != "LORA":
        raise cfg.fail("peft_type", f"'{cfg.get('peft_type')}' is not supported (only LORA)")
    for key, neutral in UNSUPPORTED.items():
        if cfg.get(key, neutral) not in (neutral, None, {}, False):
            raise cfg.fail(key, f"= {cfg.get(key)!r} is not supported")
    rank = cfg.int("r")
    if rank <= 0:
        raise cfg.fail("r", f"must be positive, got {rank}")
    alpha = cfg.float("lora_alpha", rank)
    return AdapterSpec(
        name, rank, alpha, _targets(path, cfg.get("target_modules")), cfg.bool("use_rslora", False), str(folder)
    )


def _targets(path: Path, value) -> tuple[str, ...]:
    if value == "all-linear":
        return TARGETS
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise UserError(f"{path}: 'target_modules' must be a list of module names, got {value!r}")
    short = [n.rsplit(".", 1)[-1] for n in names]
    unknown = [n for n, s in zip(names, short) if s not in TARGETS]
    if unknown:
        raise UserError(f"{path}: target module '{unknown[0]}' is not supported (supported: {', '.join(TARGETS)})")
    return tuple(t for t in TARGETS if t in short)
