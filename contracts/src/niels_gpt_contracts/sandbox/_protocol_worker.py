"""Module-protocol worker: one tree's module classes through ``_protocol_probes`` (sandbox side).

Started by ``protocol_run`` as ``python -I <this file>``, in the same
user-like environment and import isolation as the oracle's worker (whose
``_isolate`` it borrows). stdin carries one JSON request, read whole before
any stage code runs::

    {"seed", "fd", "roots", "names", "config": "module:Name",
     "classes": [[label, "module:qualname"], ...],
     "decoders": [[label, "module:function", "module:ModelClass"], ...],
     "sizes": [{"name", "cfg", "B", "T", "rows", "full"}, ...],
     "given": path or null, "out": folder}

For every class that is an ``nn.Module`` (classes that are the same object
under several labels are probed once, under the first label) and every size,
it runs a ``Probe``; with ``given`` (the base's ``weights.safetensors``), each
probe loads those weights. Without ``given``, every decoder (a function
taking ``compile_step``) also runs ``decode_probe`` at each full size, its
report under ``classes`` like a class's; and the worker writes
``out/weights.safetensors`` (the weights its subjects held, for the PR's
worker: inputs, not answers). Its answers go to file descriptor ``fd`` (a
pipe no other process has), each part behind its length as 8 big-endian
bytes: one JSON report, then every output as one safetensors blob (bfloat16
and float16 widened to float32 exactly). The report::

    {"classes": {label: {size: report}}, "defined": {label: module},
     "dtypes": {key: torch dtype}, "skipped": {label: why}, "fatal": text or null,
     "weights_sha256": the weights file's digest (the base's side)}

This process decides nothing.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True  # -I ignores PYTHONDONTWRITEBYTECODE

import functools  # noqa: E402
import hashlib  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import struct  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).parent


def _sibling(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _resolve(dotted: str) -> Any:
    module, _, qualname = dotted.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


@functools.cache
def _weights(path: str) -> dict[str, Any]:
    """The base's weights file, read once for every class and size."""
    from safetensors.torch import load_file

    return load_file(path)


def _given(path: str | None, label: str, size: str) -> dict[str, Any] | None:
    if path is None:
        return None
    prefix = f"{label}|{size}|"
    found = _weights(path)
    return {k[len(prefix) :]: v for k, v in found.items() if k.startswith(prefix)}


def main() -> None:
    oracle_worker = _sibling("_oracle_worker")
    oracle_worker._not_dumpable()
    request = json.loads(sys.stdin.buffer.read())
    answer = os.fdopen(int(request["fd"]), "wb", closefd=True)
    blob = b""
    oracle_worker._isolate(list(request["roots"]), list(request["names"]))
    report: dict[str, Any] = {
        "classes": {}, "defined": {}, "dtypes": {}, "skipped": {}, "fatal": None
    }  # fmt: skip
    try:
        state = _sibling("_protocol_state")
        probes = _sibling("_protocol_probes")
        import torch
        from safetensors.torch import save, save_file

        config_type = _resolve(request["config"])
        state.snapshot()  # the first snapshot imports the config modules
        seen: dict[int, str] = {}
        outputs: dict[str, torch.Tensor] = {}
        weights: dict[str, torch.Tensor] = {}
        for label, dotted in request["classes"]:
            try:
                cls = _resolve(dotted)
            except Exception as err:
                report["skipped"][label] = f"not importable: {probes.why(err)}"
                continue
            if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
                report["skipped"][label] = "not an nn.Module class"
                continue
            if id(cls) in seen:
                report["skipped"][label] = f"the same class as {seen[id(cls)]}"
                continue
            seen[id(cls)] = label
            report["defined"][label] = cls.__module__
            for raw in request["sizes"]:
                size = probes.Size(raw["name"], raw["cfg"], raw["B"], raw["T"], raw["rows"])
                probe = probes.Probe(
                    label, cls, size, config_type, int(request["seed"]),
                    state.snapshot, state.changed,
                    given=_given(request.get("given"), label, size.name), full=bool(raw["full"]),
                )  # fmt: skip
                found, tensors = probe.run()
                report["classes"].setdefault(label, {})[size.name] = found
                outputs.update(tensors)
                prefix = f"{label}|{size.name}|"
                weights.update({prefix + k: v for k, v in probe.weights.items()})
        if request.get("given") is None:
            for label, dotted, model in request.get("decoders", []):
                try:
                    fn, model_cls = _resolve(dotted), _resolve(model)
                except Exception as err:
                    report["skipped"][label] = f"not importable: {probes.why(err)}"
                    continue
                report["defined"][label] = getattr(fn, "__module__", "") or ""
                for raw in request["sizes"]:
                    if not raw["full"]:
                        continue
                    size = probes.Size(raw["name"], raw["cfg"], raw["B"], raw["T"], raw["rows"])
                    found, tensors = probes.decode_probe(
                        fn, model_cls, size, config_type, int(request["seed"]),
                        state.snapshot, state.changed,
                    )  # fmt: skip
                    report["classes"].setdefault(label, {})[size.name] = found
                    prefix = f"{label}|{size.name}|"
                    outputs.update({prefix + k: v for k, v in tensors.items()})
        wide = {}
        for key, t in outputs.items():
            report["dtypes"][key] = str(t.dtype).removeprefix("torch.")
            narrow = t.dtype in (torch.bfloat16, torch.float16)
            wide[key] = (t.float() if narrow else t).contiguous()  # t's shape
        blob = save(wide)
        if request.get("given") is None:
            held = {k: v.contiguous() for k, v in weights.items()}
            path = Path(request["out"]) / "weights.safetensors"
            save_file(held, str(path))
            report["weights_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    except BaseException as err:  # the tree cannot be imported or probed at all
        report["fatal"] = oracle_worker._why(err)
    text = json.dumps(report).encode("utf-8")
    answer.write(struct.pack(">Q", len(text)) + text + struct.pack(">Q", len(blob)) + blob)
    answer.close()


if __name__ == "__main__":
    main()
