"""A record's bytes do not depend on the order its keys were inserted in (sorted keys): the same
numbers give the same file, so a rerun can be compared byte for byte."""

import json

from icl_lens.results import save_result


def test_key_order_does_not_change_the_bytes(tmp_path):
    forward = {"b": 1, "a": {"y": [1.5, 2], "x": None}, "c": "text"}
    backward = {"c": "text", "a": {"x": None, "y": [1.5, 2]}, "b": 1}
    first = save_result(tmp_path / "one", "record", forward)["json"].read_bytes()
    second = save_result(tmp_path / "two", "record", backward)["json"].read_bytes()
    assert first == second
    assert json.loads(first) == forward


def test_the_png_is_matplotlibs_own_at_160_dpi_without_a_software_tag(tmp_path):
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(2, 1))
    axis.plot([0, 1], [1, 0])
    expected = io.BytesIO()
    figure.savefig(expected, format="png", dpi=160, bbox_inches="tight", metadata={"Software": None})
    png = save_result(tmp_path, "plot", {"x": 1}, figure)["png"].read_bytes()
    assert png == expected.getvalue() and b"Software" not in png


def test_results_folders(tmp_path, monkeypatch):
    """results/<chapter> under the folder holding _toc.yml (searched upward), under
    ICL_LENS_RESULTS when set, under ``root`` when given; created, nested, and again without error."""
    from icl_lens.results import repository_root, results_dir

    book = tmp_path / "repo" / "book"
    book.mkdir(parents=True)
    (tmp_path / "repo" / "_toc.yml").write_text("")
    monkeypatch.chdir(book)
    monkeypatch.delenv("ICL_LENS_RESULTS", raising=False)
    assert repository_root() == (tmp_path / "repo").resolve()
    folder = results_dir("kernels")
    assert folder == (tmp_path / "repo" / "results" / "kernels").resolve() and folder.is_dir()
    assert results_dir("kernels") == folder                       # exists already: no error
    assert results_dir("a/b", root=tmp_path / "given") == tmp_path / "given" / "a" / "b"
    monkeypatch.setenv("ICL_LENS_RESULTS", str(tmp_path / "elsewhere"))
    assert results_dir("kernels").resolve() == (tmp_path / "elsewhere" / "kernels").resolve()
    assert results_dir("kernels", root=tmp_path / "given") == tmp_path / "given" / "kernels"
    monkeypatch.chdir(tmp_path)
    assert repository_root() == tmp_path.resolve()                # no _toc.yml above: the working directory
