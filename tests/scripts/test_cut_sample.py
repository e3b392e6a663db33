"""scripts/cut_sample.py (the cut-down samples of docs/quality.md) and scripts/bench_ease_served.py (EASE's served
sizes): the sample keeps the most active users and their most frequent items, re-indexed, and drops a user left
without a train or a test item; the benchmark's bundle is EASE's I x I items and covariance."""

import pytest

from tests.helpers.scripts import load_script

cut_sample = load_script("cut_sample")
bench_ease_served = load_script("bench_ease_served")


def _write(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in rows.items():
        (folder / name).write_text("".join(" ".join(map(str, line)) + "\n" for line in lines))


def test_the_sample_keeps_the_most_active_users_and_their_most_frequent_items(tmp_path):
    _write(
        tmp_path / "src",
        {
            # user 3 has the fewest train items; item 9 is rare; user 5 keeps no test item after the cut
            "train.txt": [[1, 7, 8, 9], [3, 7], [5, 7, 8], [6, 8, 7]],
            "test.txt": [[1, 8], [3, 8], [5, 9], [6, 7]],
        },
    )
    sizes = cut_sample.main([str(tmp_path / "src"), str(tmp_path / "cut"), "--users", "3", "--items", "2"])
    # users 1, 5, 6 (3 training items, 2, 2); items 7 and 8 (the most frequent among them) -> 0 and 1
    assert (tmp_path / "cut" / "train.txt").read_text() == "0 0 1\n1 1 0\n"  # user 1, then user 6; 5 dropped
    assert (tmp_path / "cut" / "test.txt").read_text() == "0 1\n1 0\n"
    assert sizes == {"users": 2, "items": 2, "train": 4, "test": 2}


def test_a_line_that_is_not_ids_names_its_file_and_line(tmp_path):
    _write(tmp_path / "src", {"train.txt": [[1, 2]], "test.txt": [[1, "x"]]})
    with pytest.raises(ValueError, match=r"test.txt:1: expected a user id and item ids"):
        cut_sample.main([str(tmp_path / "src"), str(tmp_path / "cut")])
    assert not (tmp_path / "cut").exists()


def test_the_served_ease_bundle_is_its_items_and_covariance():
    (row,) = bench_ease_served.main(["--items", "256", "--batch", "32", "--rounds", "1"])
    parts = 256 * 256 * 4 + 256 * 256 * 8 + 256 * 64 * 4 + 64 * 64 * 8  # items and covariances, float32 / float64
    assert parts <= row["bundle_gib"] * 2**30 < parts + 4096  # + the .npy headers
    assert row["fused_ms_per_query"] > 0 and row["ratio"] > 0
