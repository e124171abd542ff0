"""The demo model shipped inside the package, so ``niels-serve`` serves at once.

``niels_gpt_serve/model/`` holds two files:

- ``demo.safetensors``: the weights of a small trained ``GPT`` (``safetensors``'
  ``save_model``, which stores the tied embedding and head once);
- ``demo.json``: what the weights are and where they came from::

      {"format": 1, "arch": "v1", "model_config": {"V", "T", "C", "L", "H", "d_ff", ...},
       "step", "steps", "tokens", "val_loss", "val_step",
       "command": "<the niels-train command that trained it>",
       "trained": "<the machine and its load>"}

``export`` writes both from a finished ``niels-train`` run (the command and
the machine are recorded as given); ``load_shipped`` builds the model from
them. Shape notation: none (whole models).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt_serve.trained import Training, read_training

__all__ = ["SHIPPED_NAME", "Shipped", "export", "load_shipped", "shipped_dir"]

SHIPPED_NAME = "demo"
FORMAT = 1


@dataclass(frozen=True)
class Shipped:
    """The shipped model, loaded: the model in eval mode and what ``demo.json`` says."""

    model: GPT
    config: ModelConfig
    arch: str
    step: int
    training: Training
    meta: dict[str, Any]


def shipped_dir() -> Path:
    """The package's ``model/`` folder (a real folder: the wheel is installed unzipped)."""
    return Path(str(resources.files("niels_gpt_serve") / "model"))


def export(run_dir: Path, out_dir: Path, command: str, trained: str) -> Path:
    """Write ``demo.safetensors`` and ``demo.json`` in ``out_dir`` from the newest
    checkpoint of ``run_dir``; returns the JSON's path.

    Raises:
        niels_gpt_experiments.loading.RunLoadError: ``run_dir`` is no loadable run.
        ValueError: the run is not a v1 ``GPT``.
    """
    from safetensors.torch import save_model

    from niels_gpt_experiments.loading import load_run

    run = load_run(run_dir, device="cpu")
    if not isinstance(run.model, GPT) or run.arch != "v1":
        raise ValueError(f"only a v1 GPT is shipped, {run_dir} holds {run.arch}")
    known = read_training(run_dir, run.step, run.meta)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_model(run.model, str(out_dir / f"{SHIPPED_NAME}.safetensors"))
    meta = {
        "format": FORMAT, "arch": run.arch, "model_config": dataclasses.asdict(run.config),
        "step": run.step, "steps": known.steps, "tokens": known.tokens,
        "val_loss": known.val_loss, "val_step": known.val_step,
        "command": command, "trained": trained,
    }  # fmt: skip
    path = out_dir / f"{SHIPPED_NAME}.json"
    path.write_text(json.dumps(meta, indent=2) + "\n")
    return path


def load_shipped(device: str = "cpu", folder: Path | None = None) -> Shipped:
    """The shipped model (``folder``: another one written by ``export``), in eval mode.

    Raises:
        FileNotFoundError: the folder lacks ``demo.json`` or ``demo.safetensors``.
        ValueError: ``demo.json`` of another format, or weights that do not fit it.
    """
    from safetensors.torch import load_model

    from niels_gpt_experiments.models import build_model

    where = folder or shipped_dir()
    meta = json.loads((where / f"{SHIPPED_NAME}.json").read_text())
    if meta.get("format") != FORMAT or meta.get("arch") != "v1":
        raise ValueError(
            f"{where / SHIPPED_NAME}.json: expected format {FORMAT} and arch v1, got "
            f"format {meta.get('format')!r}, arch {meta.get('arch')!r}"
        )
    config = ModelConfig(**meta["model_config"])
    model = build_model("v1", config)
    load_model(model, str(where / f"{SHIPPED_NAME}.safetensors"))  # strict: every tensor
    model.to(device).eval()
    training = Training(
        step=meta["step"], steps=meta.get("steps"), val_loss=meta.get("val_loss"),
        val_step=meta.get("val_step"), tokens=meta.get("tokens"),
    )  # fmt: skip
    return Shipped(model, config, "v1", meta["step"], training, meta)


def main(argv: list[str] | None = None) -> int:
    """``python -m niels_gpt_serve.shipped RUN OUT COMMAND TRAINED``: ``export``."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4:
        print(main.__doc__, file=sys.stderr)
        return 2
    print(export(Path(args[0]), Path(args[1]), args[2], args[3]).read_text(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
