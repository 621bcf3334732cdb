"""The batch divisibility rule in one place (core/batch.py): the recipe check, the workload's invariant, the
sampler and the trainer's split agree on every case, the edges included."""

from __future__ import annotations

import pytest

from recipetune.core.batch import BATCH_SPLITS, batch_problem, split_batch
from recipetune.core.expr import evaluate
from recipetune.trainer.data import GlobalBatchSampler, split_micro_batches
from recipetune.trainer.knobs import check_recipe, reference_knobs


@pytest.mark.parametrize("gbs", [1, 6, 8, 12, 16])
@pytest.mark.parametrize("dp", [1, 2, 3, 4])
@pytest.mark.parametrize("mbs", [1, 2, 3, 4, 8])
def test_every_user_of_the_rule_agrees(gbs, dp, mbs):
    splits = gbs % dp == 0 and (gbs // dp) % mbs == 0  # the rule, written out
    assert (batch_problem(gbs, dp, mbs) is None) == splits
    assert bool(evaluate(BATCH_SPLITS, {"global_batch_size": gbs, "micro_batch_size": mbs, "nproc": dp,
                                        "pp": 1, "cp": 1, "tp": 1})) == splits
    recipe = dict(reference_knobs().resolve({"global_batch_size": gbs, "micro_batch_size": mbs, "nproc": dp}))
    assert (not any("global_batch_size" in p or "micro_batch_size=" in p for p in check_recipe(recipe))) == splits
    if splits:
        assert split_batch(gbs, dp, mbs) == (gbs // dp, gbs // dp // mbs)
    else:
        with pytest.raises(ValueError, match="global_batch_size|micro_batch_size"):
            split_batch(gbs, dp, mbs)


def test_the_sampler_and_the_micro_batches_refuse_what_the_rule_refuses():
    import torch

    with pytest.raises(ValueError, match="global_batch_size=16 is not divisible by world_size=3"):
        GlobalBatchSampler(10_000, 8, 16, seed=0).rank_slice(0, 0, 3)
    with pytest.raises(ValueError, match="micro_batch_size=5 does not divide the per-process batch 16"):
        split_micro_batches(torch.zeros(16, 9, dtype=torch.long), 5)


def test_ranks_that_share_a_batch_do_not_count_as_data_parallel():
    # 4 processes as tp=2 x 2 data-parallel ranks: 6 sequences split as 3 per rank, micro-batch 3
    values = {"global_batch_size": 6, "micro_batch_size": 3, "nproc": 4, "pp": 1, "cp": 1, "tp": 2}
    assert evaluate(BATCH_SPLITS, values) and batch_problem(6, 2, 3) is None
    assert not evaluate(BATCH_SPLITS, {**values, "tp": 1})  # 4 data-parallel ranks do not divide 6
