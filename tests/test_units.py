"""``_units``: a model's repeated blocks and compacted FQN patterns, from FQNs alone."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layout_algebra._units import compact, repeated_blocks
from layout_algebra.errors import LayoutError


def _layers(prefix: str, n: int, names: tuple[str, ...] = ("attn.w", "mlp.w")) -> list[str]:
    return [f"{prefix}.{i}.{name}" for i in range(n) for name in names]


def test_the_numbered_blocks_of_a_transformers_model() -> None:
    fqns = ["model.embed_tokens.weight", *_layers("model.layers", 3), "lm_head.weight"]
    assert repeated_blocks(fqns) == ("model.layers.*",)


def test_torchtitans_blocks_and_module_fqns_alike() -> None:
    # torchtitan keeps its blocks in a ModuleDict keyed "0", "1", ...
    assert repeated_blocks(["tok_embeddings.weight", *_layers("layers", 2)]) == ("layers.*",)
    # module FQNs name the blocks themselves
    assert repeated_blocks(["layers", "layers.0", "layers.1", "layers.1.mlp"]) == ("layers.*",)


def test_only_the_outermost_container_on_a_path() -> None:
    experts = [f"layers.{i}.moe.experts.{e}.w" for i in range(2) for e in range(4)]
    assert repeated_blocks(experts) == ("layers.*",)


def test_several_containers_in_the_order_they_come() -> None:
    fqns = [*_layers("vision.blocks", 2), *_layers("text.layers", 2), "head.w"]
    assert repeated_blocks(fqns) == ("vision.blocks.*", "text.layers.*")


def test_one_numbered_child_repeats_nothing() -> None:
    assert repeated_blocks(["proj.0.weight", "proj.0.bias", "head.w"]) == ()
    assert repeated_blocks(["emb.w", "head.w"]) == ()
    assert repeated_blocks([]) == ()


def test_a_root_that_is_a_sequence_of_blocks() -> None:
    assert repeated_blocks(["0.w", "1.w", "2.w"]) == ("*",)


def test_only_ascii_digits_number_a_block() -> None:
    # torch numbers children with str(int); other digits are names
    assert repeated_blocks(["layers.\u0661.w", "layers.\u0662.w"]) == ()


@pytest.mark.parametrize(
    ("value", "part"),
    [
        ("layers.0.w", "not the string"),
        (None, "must be a collection"),
        (["layers..w"], "no empty segment"),
        ([3], "got 3"),
    ],
)
def test_what_is_no_collection_of_fqns_is_refused(value: object, part: str) -> None:
    with pytest.raises(LayoutError, match=part) as raised:
        repeated_blocks(value)  # type: ignore[arg-type]  # wrong on purpose
    assert "repeated_blocks(fqns=...)" in str(raised.value)
    with pytest.raises(LayoutError, match=part):
        compact(value, ["w"])  # type: ignore[arg-type]  # wrong on purpose


def test_compact_writes_star_where_every_block_is_chosen() -> None:
    every = [*_layers("layers", 3), "head.w"]
    chosen = [f for f in every if f.endswith("mlp.w")]
    assert compact(chosen, every) == ("layers.*.mlp.w",)
    assert compact(every, every) == ("layers.*.attn.w", "layers.*.mlp.w", "head.w")


def test_compact_keeps_fqns_where_a_star_would_take_more() -> None:
    every = _layers("layers", 3)
    half = ["layers.0.attn.w", "layers.1.attn.w"]
    assert compact(half, every) == tuple(half)
    # a star matches any segment, not only numbers: layers.extra.w would be taken too
    assert compact(
        ["layers.0.w", "layers.1.w"], ["layers.0.w", "layers.1.w", "layers.extra.w"]
    ) == (
        "layers.0.w",
        "layers.1.w",
    )


def test_compact_writes_a_star_only_for_several_fqns() -> None:
    assert compact(["a.0.w"], ["b.0.w"]) == ("a.0.w",)
    assert compact(["layers.0.w"], ["layers.0.w"]) == ("layers.0.w",)


def _matches(pattern: str, fqn: str) -> bool:
    want, got = pattern.split("."), fqn.split(".")
    return len(want) == len(got) and all(w in ("*", g) for w, g in zip(want, got, strict=True))


@given(
    layers=st.integers(1, 4),
    names=st.lists(st.sampled_from(["w", "b", "attn.w", "mlp.w", "0.w"]), min_size=1, unique=True),
    data=st.data(),
)
def test_compacted_patterns_name_exactly_the_chosen(
    layers: int, names: list[str], data: st.DataObject
) -> None:
    every = [*_layers("layers", layers, tuple(names)), "head.w", "layers.x.w"]
    chosen = data.draw(st.lists(st.sampled_from(every), unique=True))
    patterns = compact(chosen, every)
    assert {f for f in every if any(_matches(p, f) for p in patterns)} == set(chosen)
    assert len(patterns) <= len(chosen)
