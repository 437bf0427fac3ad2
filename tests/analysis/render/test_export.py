"""--png/--svg: every report figure through kaleido, offline, in one browser session; a missing kaleido
or Chromium is one line and exit 2 before any analysis; images of someone else are not overwritten."""

from __future__ import annotations

import builtins
from pathlib import Path

import plotly.graph_objects as go
import pytest

from analysis.errors import TraceError
from analysis.render.export import Image, check_export, find_chromium, image_name, refuse_existing, write_images
from analysis.report import command as report
from tests.analysis.timeline.test_timeline_traces import write_trace


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export_traces")
    return [write_trace(folder / f"{k}.sqlite", k) for k in ("naive", "overlap")]


def _no_kaleido(monkeypatch):
    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "kaleido":
            raise ImportError("No module named 'kaleido'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)


def test_without_kaleido_or_chromium_the_flag_is_one_line_and_exit_2_before_anything(
    traces, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("analysis.render.export.find_chromium", lambda: None)
    with pytest.raises(TraceError, match=r"--png/--svg: needs a system Chromium"):
        check_export(["png", "svg"])
    assert report.main([*map(str, traces), "-o", str(tmp_path / "r"), "--svg"]) == 2
    err = capsys.readouterr().err
    assert "--svg: needs a system Chromium" in err and len(err.strip().splitlines()) == 1
    _no_kaleido(monkeypatch)
    assert report.main([*map(str, traces), "-o", str(tmp_path / "r"), "--png"]) == 2
    err = capsys.readouterr().err
    assert "--png: needs kaleido (pip install" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()  # refused before the analysis: nothing written


def test_one_session_for_all_figures_with_mathjax_off(tmp_path, monkeypatch):
    pytest.importorskip("kaleido")
    import kaleido

    seen = []

    def fake(specs, kopts):
        seen.append((specs, kopts))
        for s in specs:
            Path(s["path"]).write_bytes(b"image")
        return ()

    monkeypatch.setattr(kaleido, "write_fig_from_object_sync", fake)
    figs = [go.Figure(go.Bar(x=[1], y=[i]), layout=dict(height=300 + i)) for i in range(3)]
    images = [Image(f, tmp_path / "img" / f"f{i}", 900) for i, f in enumerate(figs)]
    written = write_images(images, ["png", "svg"], "/usr/bin/chromium")
    assert [p.name for p in written] == ["f0.png", "f0.svg", "f1.png", "f1.svg", "f2.png", "f2.svg"]
    ((specs, kopts),) = seen  # one browser session
    assert kopts == {"mathjax": False, "path": "/usr/bin/chromium"}  # no CDN MathJax: no network request
    assert [s["opts"] for s in specs[::2]] == [{"format": "png", "width": 900, "height": 300 + i} for i in range(3)]


def test_a_failed_figure_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("kaleido")
    import kaleido

    monkeypatch.setattr(kaleido, "write_fig_from_object_sync", lambda specs, kopts: (RuntimeError("boom\nmore"),))
    with pytest.raises(TraceError, match=r"^image export failed: RuntimeError: boom$"):
        write_images([Image(go.Figure(), tmp_path / "x")], ["png"], "/usr/bin/chromium")


def test_images_of_someone_else_are_refused(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "index_step_breakdown.svg").write_text("mine")
    images = [Image(go.Figure(), tmp_path / "img" / "index_step_breakdown")]
    refuse_existing(images, ["png"], ours=False)  # another format: nothing in the way
    with pytest.raises(TraceError, match=r"index_step_breakdown\.svg: exists and was not written by this tool"):
        refuse_existing(images, ["svg"], ours=False)
    refuse_existing(images, ["svg"], ours=True)  # a report folder of ours: replaced
    assert image_name("naive (run 2): step 3") == "naive_run_2_step_3"


@pytest.mark.browser  # starts Chromium through kaleido
def test_report_writes_every_figure_as_png_and_svg(traces, tmp_path, capsys):
    pytest.importorskip("kaleido")
    if find_chromium() is None:
        pytest.skip("no chromium on PATH (bash scripts/install_chromium.sh)")
    out = tmp_path / "r"
    assert report.main([*map(str, traces), "-o", str(out), "--png", "--svg"]) == 0, capsys.readouterr().err
    stems = {
        "index_step_breakdown",
        "index_step_spread",
        "index_naive_collectives_per_step",
        "index_naive_stragglers",
        "index_naive_calls",
        "index_overlap_collectives_per_step",
        "index_overlap_stragglers",
        "index_overlap_calls",
        "timeline_naive",
        "timeline_overlap",
        "side_by_side",
    }
    assert {p.name for p in (out / "img").iterdir()} == {f"{s}.{f}" for s in stems for f in ("png", "svg")}
    for stem in stems:
        assert (out / "img" / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in (out / "img" / f"{stem}.svg").read_bytes()[:400]
