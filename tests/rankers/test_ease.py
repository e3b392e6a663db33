"""EASE: closed form against a dense numpy reference, scoring through the shared top-k, λ tuning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recsys.rankers.ease.solve import ease_topk, fit_ease, gram_matrix
from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.retrieval import exact_topk


def _binary_case(seed: int, num_users: int = 60, num_items: int = 25, density: float = 0.2):
    rng = np.random.default_rng(seed)
    x = rng.random((num_users, num_items)) < density
    users, items = np.nonzero(x)
    return x, UserItemCSR.from_pairs(users, items, num_users=num_users, num_items=num_items)


def _numpy_ease(x: np.ndarray, lam: float) -> np.ndarray:
    """Steck 2019, verbatim: G = XᵀX; P = inv(G + λI); B = -P / diag(P); diag(B) = 0."""
    g = x.T.astype(np.float64) @ x
    p = np.linalg.inv(g + lam * np.eye(g.shape[0]))
    b = -p / np.diag(p)
    np.fill_diagonal(b, 0.0)
    return b


@pytest.mark.parametrize("seed", range(3))
def test_gram_matrix_matches_dense(seed):
    x, train = _binary_case(seed)
    np.testing.assert_array_equal(gram_matrix(train, block=7).numpy(), x.T.astype(np.float64) @ x)


@pytest.mark.parametrize("lam", [0.5, 10.0, 300.0])
def test_fit_ease_matches_numpy_reference(lam):
    x, train = _binary_case(0)
    b = fit_ease(train, lam)
    assert b.dtype == torch.float32 and b.shape == (25, 25)
    np.testing.assert_allclose(b.numpy(), _numpy_ease(x, lam), rtol=1e-5, atol=1e-6)
    assert (torch.diagonal(b) == 0).all()


@pytest.mark.parametrize("chunk_size", [1, 8, 1000])
def test_ease_topk_matches_dense_scores(chunk_size):
    x, train = _binary_case(1)
    b = fit_ease(train, 5.0)
    # Reference: the dense scores X @ B ranked by exact_topk's rule (identity queries pick the rows).
    scores = torch.from_numpy(x.astype(np.float32)) @ b
    ref_scores, ref_ids = exact_topk(scores, torch.eye(25), 7, exclude=train)
    got_scores, got_ids = ease_topk(b, train, 7, exclude=train, chunk_size=chunk_size)
    np.testing.assert_array_equal(got_ids.numpy(), ref_ids.numpy())
    np.testing.assert_allclose(got_scores.numpy(), ref_scores.numpy(), rtol=1e-5, atol=1e-6)
    for u in range(x.shape[0]):  # seen items never come back
        assert not set(got_ids[u].tolist()) & set(train.row(u).tolist())


def test_ease_topk_sparse_and_dense_paths_agree(monkeypatch):
    import recsys.rankers.ease.solve as ease

    _, train = _binary_case(2, density=0.3)
    b = fit_ease(train, 20.0)
    monkeypatch.setattr(ease, "SPARSE_DENSITY", 1.0)  # always sparse
    sparse = ease_topk(b, train, 6, exclude=train)
    monkeypatch.setattr(ease, "SPARSE_DENSITY", 0.0)  # always dense
    dense = ease_topk(b, train, 6, exclude=train)
    assert torch.equal(sparse[1], dense[1])
    torch.testing.assert_close(sparse[0], dense[0], rtol=1e-5, atol=1e-6)


def test_bad_lambda_raises():
    _, train = _binary_case(0)
    with pytest.raises(ValueError):
        fit_ease(train, 0.0)


# ------------------------------------------------------------------------------- memory plan

GOWALLA_USERS, GOWALLA_ITEMS = 29_858, 40_981  # the LightGCN split of Gowalla


def test_plan_prefers_float64_then_float32_then_skips():
    from recsys.rankers.ease.plan import ease_peak_bytes, plan_ease

    need64 = ease_peak_bytes(1000, torch.float64, num_users=500, chunk_size=64)
    need32 = ease_peak_bytes(1000, torch.float32, num_users=500, chunk_size=64)
    assert need32 < need64
    assert plan_ease(1000, 500, int(need64 / 0.9) + 1, chunk_size=64).dtype == torch.float64
    plan = plan_ease(1000, 500, int(need64 / 0.9) - 1, chunk_size=64)
    assert plan.dtype == torch.float32 and plan.peak_bytes == need32
    plan = plan_ease(1000, 500, int(need32 / 0.9) - 1, chunk_size=64)
    assert plan.dtype is None and plan.peak_bytes == need32
    assert plan.skipped.startswith(f"needs {need32 / 1e9:.1f} GB, have {(need32 / 0.9 - 1) / 1e9:.1f} GB")
    assert plan_ease(1000, 500, None).dtype == torch.float64  # unknown memory: as before plans existed


def test_plan_at_gowalla_size_runs_float32_on_a_24_gb_machine():
    from recsys.rankers.ease.plan import ease_peak_bytes, plan_ease

    matrix32 = GOWALLA_ITEMS**2 * 4  # 6.7 GB
    peak32 = ease_peak_bytes(GOWALLA_ITEMS, torch.float32, num_users=GOWALLA_USERS)
    assert peak32 < 2.5 * matrix32  # G and A, plus the scoring chunks
    assert ease_peak_bytes(GOWALLA_ITEMS, torch.float64, num_users=GOWALLA_USERS) < 4.5 * matrix32  # G32 + A64 + B32
    plan = plan_ease(GOWALLA_ITEMS, GOWALLA_USERS, 22 * 2**30)  # MemAvailable of a 24 GiB box
    assert plan.dtype == torch.float32 and plan.describe()["dtype"] == "float32"


def _peak_growth(fn) -> int:
    """Growth of this process's peak resident memory while ``fn`` runs (Linux: VmHWM, reset first)."""

    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pytest.skip("needs Linux /proc/self/clear_refs")
    base = status("VmRSS")
    result = fn()
    del result
    return status("VmHWM") - base


@pytest.mark.parametrize(
    "dtype, overwrite, max_matrices",
    [(torch.float32, False, 1.3), (torch.float32, True, 0.3), (torch.float64, False, 3.5)],
)
def test_inverse_runs_in_place(dtype, overwrite, max_matrices):
    """ease_from_gram allocates A (+ B's float32 copy for float64), never the 2-3 temporaries of
    an out-of-place Cholesky + inverse; counted in float32 [I, I] matrices beyond G."""
    from recsys.rankers.ease.solve import ease_from_gram

    n = 1500  # 9 MB per float32 matrix: well above the allocator's noise (~1 MB)
    torch.manual_seed(0)
    x = (torch.rand(n, 400) < 0.05).float()
    gram = x @ x.T  # float32 [n, n], like the report's G
    del x
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 1000-item inverse needs no second thread, and on a busy box waits for it
    try:
        ease_from_gram(gram[:200, :200].clone(), 10.0, dtype=dtype)  # first calls load MKL's kernels: not EASE's memory
        grown = _peak_growth(lambda: ease_from_gram(gram, 10.0, dtype=dtype, overwrite=overwrite))
    finally:
        torch.set_num_threads(threads)
    assert grown < max_matrices * n * n * 4, grown / (n * n * 4)


def test_float32_and_float64_give_the_same_topk():
    x, train = _binary_case(3, num_users=200, num_items=60, density=0.15)
    b64, b32 = fit_ease(train, 20.0), fit_ease(train, 20.0, dtype=torch.float32)
    np.testing.assert_allclose(b32.numpy(), b64.numpy(), rtol=1e-3, atol=1e-5)
    ids64 = ease_topk(b64, train, 10, exclude=train)[1]
    ids32 = ease_topk(b32, train, 10, exclude=train)[1]
    assert torch.equal(ids32, ids64)


def test_ease_from_gram_leaves_g_alone_unless_told():
    from recsys.rankers.ease.solve import ease_from_gram

    x, train = _binary_case(0)
    gram = gram_matrix(train, dtype=torch.float32)
    before = gram.clone()
    b = ease_from_gram(gram, 10.0, dtype=torch.float64)
    assert torch.equal(gram, before)
    np.testing.assert_allclose(b.numpy(), _numpy_ease(x, 10.0), rtol=1e-5, atol=1e-6)
    b32 = ease_from_gram(gram, 10.0, overwrite=True)  # float32, in G's memory
    assert b32.data_ptr() == gram.data_ptr()
    np.testing.assert_allclose(b32.numpy(), _numpy_ease(x, 10.0), rtol=1e-3, atol=1e-5)
