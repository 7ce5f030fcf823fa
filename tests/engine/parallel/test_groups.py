"""Mesh groups: pure rank arithmetic against hand-written tables, then real sub-groups on 4 workers."""
from __future__ import annotations

import pytest

from mftk.engine.parallel.groups import coords_of, mesh_groups, rank_of
from mftk.errors import PlanError
from mftk.derive import Layout


def test_c_order_mesh_tp_innermost():
    lay = Layout(world=8, tp=2, dp_shard=2, pp=2)
    # rank = ((pp·R + r)·S + s)·C + c)·T + t, written out for rank 5 = pp1, s0, t1
    assert coords_of(lay, 5) == (1, 0, 0, 0, 1)
    assert all(rank_of(lay, coords_of(lay, r)) == r for r in range(8))
    assert all(lay.dp_rank(r) == mesh_groups(lay, r).dp_rank for r in range(8))  # agrees with derive.Layout


def test_groups_tp2_dp2_pp2():
    g = mesh_groups(Layout(world=8, tp=2, dp_shard=2, pp=2), 5)
    assert g.tp.ranks == (4, 5) and g.tp.rank == 1
    assert g.dp.ranks == (5, 7) and g.dp.rank == 0
    assert g.pp.ranks == (1, 5) and g.pp.rank == 1 and g.is_last_stage
    assert g.mp.ranks == (0, 1, 4, 5)
    assert g.cp.is_trivial and g.cp.name == ""
    assert g.world.ranks == tuple(range(8))


def test_hsdp_and_cp_groups():
    lay = Layout(world=8, dp_replicate=2, dp_shard=2, cp=2)
    g = mesh_groups(lay, 3)  # coords (pp0, r0, s1, c1, t0)
    assert g.cp.ranks == (2, 3)
    assert g.dp_shard.ranks == (1, 3) and g.dp_replicate.ranks == (3, 7)
    assert g.fsdp.ranks == (0, 1, 2, 3)  # dp_shard × cp
    assert g.dp.ranks == (1, 3, 5, 7) and g.dp_cp.ranks == tuple(range(8))


def test_expert_groups_are_consecutive_runs():
    lay = Layout(world=8, tp=2, dp_shard=4, ep=4)
    g = mesh_groups(lay, 6)
    assert g.ep.ranks == (4, 5, 6, 7) and g.edp.ranks == (2, 6)


def test_bad_layouts_are_rejected():
    with pytest.raises(PlanError, match="multiply to the world size"):
        mesh_groups(Layout(world=4, tp=2), 0)
    with pytest.raises(PlanError, match="expert_parallel=3 must divide"):
        mesh_groups(Layout(world=4, tp=2, dp_shard=2, ep=3), 0)


@pytest.mark.slow
@pytest.mark.engine
def test_sub_group_collectives_on_four_workers(four_rank):
    assert sorted(four_rank) == [0, 1, 2, 3]
    for rank, res in four_rank.items():
        tp = [rank - rank % 2, rank - rank % 2 + 1]
        dp = [rank % 2, rank % 2 + 2]
        assert res["tp_ranks"] == tp and res["dp_ranks"] == dp and res["ep_ranks"] == tp
        assert res["tp_sum"] == sum(tp) and res["dp_sum"] == sum(dp) and res["dp_max"] == max(dp)
        assert res["tp_gather"] == tp and res["dp_gather"] == dp and res["world_gather"] == [0, 1, 2, 3]
        assert res["dp_bcast"] == dp[1]
        assert res["dp_p2p"] == (dp[1] if rank == dp[0] else dp[0])
