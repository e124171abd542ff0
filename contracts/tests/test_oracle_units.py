"""The oracle's trusted parts on their own: the dtype-derived bound and the frame reader.

The bound must let two honest computations of one call through and catch a
difference the size of a leaked token; the reader must refuse any stream
that breaks the protocol (the PR's worker writes it), never guess.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest
from safetensors.numpy import save as save_arrays

from niels_gpt_contracts.sandbox import oracle_run
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.sandbox.oracle_run import Stream, Unreadable, read_stream
from niels_gpt_contracts.verdict import tolerance


def _sum_orders(n: int, dtype: type[np.floating]) -> tuple[np.ndarray, np.ndarray]:
    """One sum of ``n`` terms taken in two orders, rounded in ``dtype`` along the way."""
    rng = np.random.default_rng(0)
    terms = rng.standard_normal((64, n)).astype(dtype)
    forward = np.cumsum(terms, axis=1, dtype=dtype)[:, -1]
    backward = np.cumsum(terms[:, ::-1], axis=1, dtype=dtype)[:, -1]
    return forward, backward


@pytest.mark.parametrize(("dtype", "name"), [(np.float32, "float32"), (np.float64, "float64")])
def test_two_summation_orders_are_within_the_bound(dtype: type[np.floating], name: str) -> None:
    a, b = _sum_orders(1024, dtype)
    assert not np.array_equal(a, b)  # rounding really differs
    assert tolerance.compare(a, b, name, stages=1, reduction=1024) is None


@pytest.mark.parametrize(("name", "at"), [("float64", 600), ("float32", 60)])
def test_a_leaked_token_is_beyond_the_bound(name: str, at: int) -> None:
    """Position ``at`` mixes in 1/at of the next value, the scale of a causal leak there.

    In float32 the bound at n = 700 is about 1e-3 of the largest value, so a
    leak diluted over 600 positions hides in it: the drivers catch those with
    float64 calls (every T of the attention sweep), where it stands out.
    """
    rng = np.random.default_rng(1)
    want = rng.standard_normal((1, 700, 8))
    got = want.copy()
    got[0, at] += want[0, at + 1] / at
    dev = tolerance.compare(got.astype(name), want.astype(name), name, stages=4, reduction=700)
    assert dev is not None and f"at (0, {at}," in dev.text


def test_the_bound_is_derived_from_the_dtype() -> None:
    assert tolerance.rtol("float32", 4, 1024) == pytest.approx(4 * 1027 * 2.0**-24)
    assert tolerance.rtol("bfloat16", 4, 1024) == pytest.approx(4 * (3 * 2.0**-8 + 1024 * 2.0**-24))
    assert tolerance.rtol("float64", 1, 1) == pytest.approx(4 * 2.0**-53)
    # bfloat16 arithmetic returned in float32 is bounded by bfloat16's eps
    assert tolerance.widest_error("float32", "bfloat16") == "bfloat16"


def test_specials_integers_and_exact_zeros() -> None:
    nan = np.array([1.0, np.nan, np.inf])
    assert tolerance.compare(nan.copy(), nan, "float64", stages=1, reduction=1) is None
    assert tolerance.compare(np.array([1.0, 0.0, np.inf]), nan, "float64", stages=1, reduction=1)
    ids = tolerance.compare(np.array([3, 4]), np.array([3, 5]), "int64", stages=1, reduction=1)
    assert ids is not None and ids.text.endswith("(1,): 4 where 5 was expected")  # plain ints
    assert tolerance.compare(np.zeros(3), np.zeros(4), "float64", stages=1, reduction=1)
    probs = np.tril(np.ones((2, 4, 4)))
    assert tolerance.upper_zero(probs) is None
    probs[1, 0, 3] = 1e-30
    assert tolerance.upper_zero(probs) is not None
    assert tolerance.zero(np.array([0.0, -0.0])) is None
    assert tolerance.zero(np.array([0.0, 1e-300])) is not None


def _frame(header: dict[str, object], *blobs: bytes) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack(">I", len(head)) + head + b"".join(blobs)


def _call(
    arrays: dict[str, Any],
    dtypes: dict[str, str] | None = None,
    name: str = "c",
    fields: dict[str, Any] | None = None,
) -> bytes:
    """Call ``name``'s frame: ``arrays`` as one safetensors blob, ``dtypes`` naming them,
    ``fields`` laid over the header."""
    blob = save_arrays(arrays)
    named = dtypes if dtypes is not None else {k: str(a.dtype) for k, a in arrays.items()}
    tensors = {"dtypes": named, "nbytes": len(blob)}
    return _frame({**CALL, "call": name, "tensors": tensors, **(fields or {})}, blob)


CALL = {
    "kind": "call", "stage": "s", "call": "c", "desc": "d", "stages": 1, "reduction": 1,
    "rules": [], "relations": [], "compare": None, "error": None, "casts": [], "values": {},
}  # fmt: skip
OUT = {"out": np.array([1.5, -2.0])}
GOOD = _call(OUT)


def test_a_well_formed_stream_is_read() -> None:
    widened = {"h": np.array([0.5], np.float32), "m": np.array([1, 0], np.uint8)}
    frames = GOOD + _call(widened, {"h": "bfloat16", "m": "bool"}, name="d")
    stream = Stream("head")
    assert read_stream(io.BytesIO(frames + _frame({"kind": "done"})), stream)
    out = stream.calls[("s", "c")].outputs["out"]
    assert out.dtype == "float64" and out.data.tolist() == [1.5, -2.0]
    wide = stream.calls[("s", "d")].outputs
    assert (wide["h"].dtype, wide["m"].dtype, wide["m"].data.tolist()) == (
        "bfloat16",
        "bool",
        [1, 0],
    )


def _blob_cut(frame: bytes, keep: int) -> bytes:
    """``frame`` with its blob cut to ``keep`` bytes and the header saying so."""
    head = json.loads(frame[4 : 4 + struct.unpack(">I", frame[:4])[0]])
    head["tensors"]["nbytes"] = keep
    return _frame(head, frame[-len(save_arrays(OUT)) :][:keep])


@pytest.mark.parametrize(
    "broken",
    [
        _blob_cut(GOOD, 15),  # a blob safetensors' parser refuses
        _call(OUT, {"out": "object"}),  # a dtype the protocol does not know
        _call(OUT, {"out": "float32"}),  # float64 values sent for a float32 tensor
        _call(OUT, {"other": "float64"}),  # the blob holds other tensors than named
        _call({"out": np.array([1, 2], np.uint16)}, {"out": "int16"}),  # a type not on the wire
        _frame({**CALL, "tensors": [{"key": "out"}]}),  # the old per-tensor list
        GOOD[:-8],  # the stream ends inside the blob
        _frame({"kind": "surprise"}),
        struct.pack(">I", 1 << 30),  # a header too large to believe
        GOOD + GOOD,  # one call answered twice
        struct.pack(">I", 3) + b"{{{",
        _call(OUT, fields={"stages": True}),
        _call(OUT, fields={"reduction": -1}),
        _call(OUT, fields={"relations": ["x"]}),
        _frame({"kind": "held", "stage": "s", "call": "c", "desc": "d"}),
        _frame({"kind": "ops", "stage": "s", "ops": {"c": [1]}}),
    ],
    ids=[
        "blob",
        "dtype",
        "wire",
        "keys",
        "uint16",
        "list",
        "short",
        "kind",
        "huge",
        "twice",
        "json",
        "bool-count",
        "negative",
        "relation",
        "held-bytes",
        "op-name",
    ],
)
def test_a_broken_stream_is_refused(broken: bytes) -> None:
    with pytest.raises(Unreadable):
        read_stream(io.BytesIO(broken + _frame({"kind": "done"})), Stream("head"))


def test_a_broken_header_is_refused_in_one_escaped_line() -> None:
    """msgspec's reason, the hostile value escaped: a verdict quotes it on one line."""
    with pytest.raises(Unreadable) as caught:
        read_stream(io.BytesIO(_frame({"kind": "sur\nprise\x1b[2J"})), Stream("head"))
    assert str(caught.value) == "a frame header: Invalid value 'sur\\nprise\\x1b[2J' - at `$.kind`"
    with pytest.raises(Unreadable, match=r"Expected `int`, got `bool` - at `\$.stages`"):
        read_stream(io.BytesIO(_frame({**CALL, "stages": True})), Stream("head"))


def test_the_header_type_names_every_dtype_on_the_wire() -> None:
    assert set(get_args(oracle_run.WireDtype)) == set(oracle_run.WIRE)


def test_a_workers_code_lies_where_no_part_of_its_path_names_the_checker() -> None:
    """A stage module's ``__file__`` in a worker looks like a user's install: the copy
    lies right in the system's temporary folder (not in a verdict's scratch), and no
    folder the checker makes on the way is named for it (``contracts-pr-...``,
    ``sandbox``, ``oracle-...``). The temporary folder itself is the caller's."""
    home = oracle_run.user_like_home()
    try:
        assert home.parent == Path(tempfile.gettempdir())
        site = oracle_run.site_folder([], home)
        marks = ("contracts", "sandbox", "oracle", "pytest", "niels")
        made = site.relative_to(home.parent).parts  # what the checker named
        named = [part for part in made for mark in marks if mark in part.lower()]
        assert named == []
        assert site.parts[-3:] == ("lib", "python3", "site-packages")
    finally:
        shutil.rmtree(home)


def test_the_workers_homes_are_removed_even_when_a_run_fails_before_its_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The homes lie outside the verdict's scratch, so nothing else removes them:
    ``run`` does, on every way out."""
    made: list[Path] = []

    def home() -> Path:
        made.append(tmp_path / f"home-{len(made)}")
        made[-1].mkdir()
        return made[-1]

    def snapshot(_paths: Any) -> Any:
        raise OSError("unreadable")

    monkeypatch.setattr(oracle_run, "user_like_home", home)
    monkeypatch.setattr(oracle_run.Snapshot, "take", snapshot)
    box = Sandbox.prepare(sys.executable, tmp_path / "scratch" / "sandbox", ["niels_gpt"], 1)
    jobs = [oracle_run.Job(label, [], {}) for label in ("base", "head")]
    with pytest.raises(OSError, match="unreadable"):
        oracle_run.run(box, jobs, 1.0)
    assert len(made) == 2
    assert [h for h in made if h.exists()] == []


def test_a_stream_without_its_end_is_not_done() -> None:
    assert read_stream(io.BytesIO(GOOD), Stream("head")) is False


def test_an_oracle_row_names_the_module_the_pr_changed() -> None:
    """Not the package's ``__init__.py`` (a re-export): the module the PR edited, or
    else the first that holds code."""
    from pathlib import Path

    from niels_gpt_contracts.checks.context.loading import load_specs
    from niels_gpt_contracts.gitdiff import GitRepo, WorkingTree
    from niels_gpt_contracts.verdict.oracle_compare import Judge

    spec = load_specs(WorkingTree(GitRepo(Path(__file__).resolve().parents[2])))["attention"]
    causal = next(f for f in spec.module_files if f.endswith("/attention/causal.py"))
    other = next(f for f in spec.module_files if not f.endswith(("__init__.py", "causal.py")))
    assert spec.module_files[0].endswith("__init__.py")
    j = Judge("attention", "oracle:cpu", frozenset({causal}))
    j.add(spec, "oracle.differs", "x")
    assert j.found[-1].path == causal
    j = Judge("attention", "oracle:cpu", frozenset({other}))
    j.add(spec, "oracle.differs", "x")
    assert j.found[-1].path == other
    j = Judge("attention", "oracle:cpu")
    j.add(spec, "oracle.differs", "x")
    assert not str(j.found[-1].path).endswith("__init__.py")


def test_a_broken_invariant_is_read_before_the_differences_it_causes() -> None:
    from niels_gpt_contracts.result import Violation
    from niels_gpt_contracts.verdict.oracle_compare import Judge

    j = Judge("attention", "oracle:cpu")
    for rule, owner in (
        ("oracle.differs", "attention"),
        ("oracle.differs", "block"),
        ("oracle.invariant", "attention"),
        ("oracle.side-effect", "block"),
    ):
        j.found.append(Violation(rule, None, None, rule, "attention", "oracle:cpu"))
        j.owners.append(owner)
    found, owners = j.contracts_first()
    assert [v.rule for v in found] == [
        "oracle.invariant", "oracle.side-effect", "oracle.differs", "oracle.differs"
    ]  # fmt: skip
    assert owners == ["attention", "block", "attention", "block"]


def test_an_invariant_or_runtime_rule_broken_on_the_pr_is_one_row_not_one_per_stream() -> None:
    """The base's and the float64 reference's streams come from one driver and declare
    the same invariants and watched calls; a verdict compares the PR's answers with both,
    and each broken promise is still one row (and each invariant counted once)."""
    from pathlib import Path

    from niels_gpt_contracts.checks.context.loading import load_specs
    from niels_gpt_contracts.gitdiff import GitRepo, WorkingTree
    from niels_gpt_contracts.sandbox.oracle_run import Call, Output
    from niels_gpt_contracts.verdict.oracle_compare import Judge

    spec = load_specs(WorkingTree(GitRepo(Path(__file__).resolve().parents[2])))["attention"]
    watched = next(r for r in spec.rules if r.runtime)
    zero = {"kind": "zero", "lhs": ["c", "out", []]}

    def answer(out: list[float]) -> Call:
        return Call(
            "attention", "c", "d", 1, 1, (watched.id,), (zero,), None, None, None, "",
            {}, (), {"out": Output("float64", np.array(out))},
        )  # fmt: skip

    head, base, ref = Stream("head"), Stream("base"), Stream("ref")
    head.calls[("attention", "c")] = answer([0.0, 3.0])  # not zero on the PR's code
    head.ops["attention"] = {"c": ("aten::scaled_dot_product_attention",)}
    for trusted in (base, ref):
        trusted.calls[("attention", "c")] = answer([0.0, 0.0])
    j = Judge("attention", "oracle:cpu")
    for trusted in (base, ref):  # as verdict.oracle._decide judges a stage with both
        j.stage(spec, head, trusted, exact=trusted is ref, what="differs")
        j.runtime(spec, head, trusted)
    rules = [v.rule for v in j.found]
    assert rules.count("oracle.invariant") == 1, rules
    assert rules.count(watched.rule_id) == 1, rules
    assert j.relations == 1
