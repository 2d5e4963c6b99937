"""The merged kernel picks survive concurrent writer processes."""


def _merge_many(folder: str, start: int) -> None:
    from pathlib import Path

    from adapters.model import autotune
    for i in range(start, start + 60):
        with autotune._locked(Path(folder)):
            autotune._merge(Path(folder) / "k.json", "k", {f"h{i}": {"pick": i}}, "3.6")


def test_merged_picks_keep_the_first_and_survive_concurrent_writers(tmp_path):
    """autotune's merge: a pick already in the file wins over a later one for the same key
    (processes sharing the folder keep one pick), and three processes merging at once under
    the folder's lock lose none of each other's entries."""
    import json
    import multiprocessing

    from adapters.model import autotune
    file = tmp_path / "k.json"
    autotune._merge(file, "k", {"a": {"BK": 64}}, "3.6")
    autotune._merge(file, "k", {"a": {"BK": 32}, "b": {"BK": 32}}, "3.6")
    assert json.loads(file.read_text())["autotune_entries"] == {"a": {"BK": 64}, "b": {"BK": 32}}
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_merge_many, args=(str(tmp_path), 1000 * k)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    entries = json.loads(file.read_text())["autotune_entries"]
    assert all(p.exitcode == 0 for p in procs) and len(entries) == 2 + 180
