"""`python -m analysis.timeline` and the lanes it draws, on synthetic and real exports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from plotly.offline import get_plotlyjs

from analysis import analyze_trace
from analysis.render.html_page import PLOTLY_FILE
from analysis.run.loaded_run import load_trace, measure_run
from analysis.run.run_files import find_runs
from analysis.timeline import command as timeline
from analysis.timeline.lane_segments import FROM_GPU, FROM_NVTX, GPU_COMM, GPU_COMPUTE, STRIP
from analysis.timeline.lanes import Selection, build_panel
from analysis.trace.patterns import Patterns
from tests.analysis.overlap_fixtures import write_cpu_ddp_wait
from tests.analysis.timeline.test_timeline_traces import write_trace
from tests.support.progress import without_progress
from tests.support.synthetic import START_END, NsysWriter

REAL = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "nsys2026_2xH100_torchrun.sqlite"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("traces")
    return {
        name: write_trace(folder / f"{name}.sqlite", name.split("_")[0], gpu=not name.endswith("cpu"))
        for name in ("naive", "overlap", "naive_cpu", "overlap_cpu")
    }


@pytest.fixture(scope="module")
def measured(traces):
    """{name: (measured run, the analysis' per-step rows)} of the module's traces, loaded once (the
    tests only read them)."""
    out = {}
    for name in ("naive", "overlap", "overlap_cpu"):
        run = measure_run(load_trace(traces[name]))
        out[name] = run, analyze_trace(run.trace).steps
    return out


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = timeline.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_naive_vs_overlap_page_and_figures(traces, tmp_path, capsys):
    out = tmp_path / "reports" / "naive_vs_overlap.html"
    code, stdout, _ = run_cli(capsys, traces["naive"], traces["overlap"], "-o", out, "--step", 1, "--format", "json")
    assert code == 0
    rows = json.loads(stdout)
    assert [r["implementation"] for r in rows] == ["naive", "overlap"]
    assert rows[0]["overlap_pct"] == 0.0 and rows[0]["exposed_comm_ms"] == pytest.approx(8.95)
    assert 40 < rows[1]["overlap_pct"] < 50 and rows[1]["exposed_comm_ms"] < rows[0]["exposed_comm_ms"] * 1.5
    page = out.read_text()
    assert get_plotlyjs() not in page and f'src="{PLOTLY_FILE}"' in page  # loaded from beside the page
    assert (out.parent / PLOTLY_FILE).read_text(encoding="utf-8") == get_plotlyjs()
    assert "overlapped 0.0%" in page and "overlapped 43.9%" in page  # panel titles


def test_one_progress_line_says_what_the_page_draws(traces, tmp_path, capsys):
    """The segment counts in one line: all drawn = the opening steps' (the summary's `segments`) + the
    whole runs' behind the button, each counted from the panels themselves."""
    import re

    from analysis import open_runs

    paths = [traces["naive"], traces["overlap"]]
    code, stdout, err = run_cli(capsys, *paths, "-o", tmp_path / "t.html", "--format", "json")
    assert code == 0
    said = [line for line in err.splitlines() if "segments" in line]
    assert len(said) == 1, err
    drawn, opening, whole = map(
        int, re.search(r"(\d+) segments drawn.*: (\d+) in the steps it opens on, (\d+) behind", said[0]).groups()
    )
    panels = [p for p, _ in open_runs(paths).timeline_panels()]
    assert opening == sum(r["segments"] for r in json.loads(stdout)) == sum(len(p.segments) for p in panels)
    assert whole == sum(len(p.overview.segments) for p in panels) and drawn == opening + whole


def test_summary_is_the_view_the_page_opens_on_and_names_the_whole_run(traces, measured, tmp_path, capsys):
    """Without --step each row describes the step its panel opens on (the representative step), the same
    figures as the panel's title; the whole run's figures come beside it, named. Both are checked against
    means taken here from the analysis' raw per-step rows."""
    from analysis.timeline.representative import representative_step

    out = tmp_path / "t.html"
    code, stdout, _ = run_cli(capsys, traces["naive"], traces["overlap"], "-o", out, "--format", "json")
    assert code == 0
    page = out.read_text()
    for row, name in zip(json.loads(stdout), ("naive", "overlap"), strict=True):
        steps = measured[name][1]
        step, rank = representative_step(steps)
        assert row["view"].startswith(f"step {step} (representative, r{rank} ") and row["view"].endswith("all ranks")
        at = steps.loc[steps["step"] == step]
        assert row["steps"] == len(at) and row["ranks"] == at["rank"].nunique()  # steps: rank-steps averaged
        for key in ("step_ms", "comm_ms", "exposed_comm_ms"):
            assert row[key] == pytest.approx(sum(at[key]) / len(at))
            assert row["whole_run"][key] == pytest.approx(sum(steps[key]) / len(steps))
        assert row["whole_run"]["view"] == "all steps, all ranks" and row["whole_run"]["steps"] == len(steps)
        assert f"exposed comm {row['exposed_comm_ms']:.2f} ms" in page  # the panel title says the same
    assert "naive: naive all-reduces each gradient after backward" in page and "notes" in row
    assert "Each panel opens on its representative step: the step closest to the run&#x27;s medians" in page
    code, table, _ = run_cli(capsys, traces["naive"], "-o", out)
    lines = table.splitlines()
    assert any("behind 'whole run' (all steps, all ranks" in line for line in lines)
    assert any(line.startswith("note: ") and "no overlap with backward, by design" in line for line in lines)


def test_one_trace_page_switches_to_any_step_titled_with_its_figures(traces, measured):
    from analysis import open_runs
    from analysis.timeline.figure import build_figure

    ((panel, row),) = open_runs([traces["overlap"]]).timeline_panels()
    steps = measured["overlap"][1]
    fig = build_figure([panel])
    levels, switch = fig.layout.updatemenus
    assert [b.label for b in levels.buttons] == ["one step", "whole run"]
    assert levels.buttons[0].args[1]["annotations[0].text"] == panel.title  # each view titled with its own figures
    assert "all steps, all ranks" in levels.buttons[1].args[1]["annotations[0].text"]
    numbered = sorted(int(k) for k in steps["step"].dropna().unique())
    assert [b.label for b in switch.buttons] == [f"step {k}" for k in numbered]
    assert switch.buttons[switch.active].label == row.view.split(" (")[0]  # it reads the opened step
    for button, (k, lo, hi, _) in zip(switch.buttons, panel.overview.steps, strict=True):
        at = steps.loc[steps["step"] == k]
        assert f"exposed comm {sum(at['exposed_comm_ms']) / len(at):.2f} ms" in button.args[1]["annotations[0].text"]
        assert button.args[1]["xaxis.range"] == [(lo - panel.origin_ns) / 1e6, (hi - panel.origin_ns) / 1e6]
        assert button.args[0]["visible"] == [not t.visible for t in fig.data]  # the whole run's traces


def test_self_contained_page_embeds_plotly_and_writes_nothing_beside_it(traces, tmp_path, capsys):
    out = tmp_path / "one.html"
    assert run_cli(capsys, traces["naive"], "-o", out, "--self-contained")[0] == 0
    assert out.read_text().count(get_plotlyjs()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.html"]


def test_plotly_file_is_written_once_and_a_foreign_one_is_refused(traces, tmp_path, capsys):
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    assert run_cli(capsys, traces["naive"], "-o", a)[0] == 0
    bundle = tmp_path / PLOTLY_FILE
    mtime = bundle.stat().st_mtime_ns
    assert run_cli(capsys, traces["overlap"], "-o", b)[0] == 0
    assert bundle.stat().st_mtime_ns == mtime  # the same bundle is left as it is
    bundle.chmod(0o644)
    bundle.write_text("// someone else's plotly")
    code, _, err = run_cli(capsys, traces["naive"], "-o", a)
    assert code == 2 and err.count("\n") == 1 and "refusing to overwrite" in err
    assert bundle.read_text() == "// someone else's plotly"


def test_overlap_strip_is_the_analysis_hidden_and_exposed_comm(measured):
    """Per rank and step the strip's hidden part measures overlap_ms and its exposed part exposed_comm_ms."""
    for name, (run, steps) in measured.items():
        for step in (1, 2):
            panel = build_panel(run, Selection(step=step))
            strip = panel.segments.loc[panel.segments["group"] == STRIP]
            for rank, row in steps.loc[steps["step"] == step].set_index("rank").iterrows():
                mine = strip.loc[strip["rank"] == rank]
                for category, column in (("hidden", "overlap_ms"), ("exposed", "exposed_comm_ms")):
                    part = mine.loc[mine["category"] == category]
                    busy_ms = part["busy"].sum() / 1e6  # merged blocks keep their members' busy time
                    assert busy_ms == pytest.approx(row[column], abs=1e-6), (name, step, rank, category)


def test_shading_is_exactly_the_analysis_overlap(measured):
    for name, (run, steps) in measured.items():
        panel = build_panel(run, Selection(step=1))
        shaded_ms = (panel.overlap["end"] - panel.overlap["start"]).sum() / 1e6 / 2  # mean over two ranks
        expected = steps.loc[steps["step"] == 1, "overlap_ms"].mean()
        assert shaded_ms == pytest.approx(expected), name
    assert expected > 0


def test_shading_leaves_out_a_gradient_wait_inside_backward(tmp_path):
    """DDP-shaped CPU trace: the `grad_sync` wait inside backward is not compute, as in the analysis."""
    trace = load_trace(write_cpu_ddp_wait(tmp_path / "ddp.sqlite"))
    panel = build_panel(measure_run(trace), Selection())
    shaded_ns = int((panel.overlap["end"] - panel.overlap["start"]).sum())
    assert shaded_ns == round(analyze_trace(trace).steps["overlap_ms"].iloc[0] * 1e6) == 200


def _cpu_wait_trace(path, wait_text: str):
    """CPU rank, step 0 = backward [0, 1000); async comm [100, 600); blocking comm [200, 400) and a
    wait range [650, 700) under an async comm [620, 800). Metrics: compute loses both waits, so
    overlap = [100, 200) + [400, 600) + [620, 650) + [700, 800) = 430 ns."""
    w = NsysWriter(path, cupti=False)
    w.nvtx(1, 1, np.array([0, 0]), np.array([1000, 1000]), np.array(["step 0", "backward"], dtype=object))
    w.nvtx(
        1,
        2,
        np.array([100, 620]),
        np.array([600, 800]),
        np.array(["comm:a", "comm:b"], dtype=object),
        kind=START_END,
        end_tid=1,
    )
    w.nvtx(1, 1, np.array([200, 650]), np.array([400, 700]), np.array(["comm:blocking", wait_text], dtype=object))
    return w.close()


@pytest.mark.parametrize(
    "wait_text, patterns", [("grad_sync", Patterns()), ("wait_for_grads", Patterns(sync_wait=r"^wait_for_grads$"))]
)
def test_cpu_shading_cuts_blocking_comm_and_sync_waits_like_the_analysis(tmp_path, wait_text, patterns):
    trace = load_trace(_cpu_wait_trace(tmp_path / "w.sqlite", wait_text), patterns)
    panel = build_panel(measure_run(trace, patterns), Selection(step=0))
    shaded_ns = int((panel.overlap["end"] - panel.overlap["start"]).sum())
    assert shaded_ns == round(analyze_trace(trace, patterns).steps["overlap_ms"].iloc[0] * 1e6) == 430


def test_lanes_per_rank_and_hover_fields(measured):
    panel = build_panel(measured["overlap"][0], Selection(step=1))
    assert panel.lanes["label"].tolist() == [
        f"r{r} {lane}"
        for r in (0, 1)
        for lane in ("CPU step", "CPU phases", "CPU comm", "GPU s7 compute", "GPU s13 comm", "overlap")
    ]
    seg = panel.segments
    comm = seg.loc[(seg["category"] == "comm:all_reduce") & (seg["src"] == FROM_NVTX)]
    assert len(comm) and comm["stream"].str.contains("→").all()  # async ranges end on the worker thread
    gpu = seg.loc[seg["src"] == FROM_GPU]
    kernel = gpu.loc[gpu["group"] == GPU_COMPUTE].loc[lambda k: k["start"] > panel.origin_ns + 45_000_000].iloc[0]
    assert kernel["phase"] == "step 1 · backward" and kernel["category"] == "backward"  # coloured by its phase
    comm_kernels = gpu.loc[gpu["group"] == GPU_COMM]
    assert set(comm_kernels["category"]) == {"comm:all_reduce"}
    assert set(comm_kernels["phase"]) == {"step 1 · backward", "step 1 · grad_sync"}
    # The step window is the GPU-aware step (start to the next step's start, 100.2 ms here; the CPU
    # range is 90.2 ms) and everything drawn touches it.
    assert panel.window_ns[1] - panel.window_ns[0] == pytest.approx(100_200_000)


def test_cpu_only_traces_draw_their_nvtx_lanes(traces, measured, tmp_path, capsys):
    out = tmp_path / "cpu.html"
    code, stdout, _ = run_cli(capsys, traces["naive_cpu"], traces["overlap_cpu"], "-o", out, "--format", "csv")
    assert code == 0 and out.exists()
    lines = stdout.strip().splitlines()
    assert lines[0].startswith("trace,implementation,view") and len(lines) == 3
    panel = build_panel(measured["overlap_cpu"][0], Selection())
    assert not panel.lanes["label"].str.contains("GPU").any()
    assert len(panel.overlap) == 2 * 3 * 2  # two comm ranges inside backward, per step and rank


def test_rank_selection_keeps_one_rank(traces, measured, tmp_path, capsys):
    code, stdout, _ = run_cli(capsys, traces["overlap"], "-o", tmp_path / "r1.html", "--rank", 1, "--format", "json")
    assert code == 0 and json.loads(stdout)[0]["ranks"] == 1
    panel = build_panel(measured["overlap"][0], Selection(rank=1))
    assert set(panel.lanes["rank"]) == {1} and set(panel.overlap["rank"]) == {1}


def test_per_rank_files_of_one_run_form_one_panel(tmp_path, capsys):
    files = [write_trace(tmp_path / f"naive.rank{r}.sqlite", "naive", ranks=1, first_rank=r) for r in (0, 1)]
    other = write_trace(tmp_path / "overlap.sqlite", "overlap")
    inputs = find_runs([*files, other])
    assert [(i.name, len(i.paths)) for i in inputs] == [("naive", 2), ("overlap", 1)]
    code, stdout, _ = run_cli(capsys, *files, other, "-o", tmp_path / "t.html", "--step", 1, "--format", "json")
    rows = json.loads(stdout)
    assert code == 0 and [r["ranks"] for r in rows] == [2, 2]
    assert rows[0]["trace"].endswith("naive.rank*.sqlite (2 files)") and rows[0]["overlap_pct"] == 0.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.sqlite"], "no such file"),
        (["{naive}", "--step", "7"], "--step 7: the input has 3 steps (0-2)"),
        (["{naive}", "--rank", "4"], "--rank 4: the input has ranks 0, 1"),
        (["{naive}", "--step", "-1"], "--step -1"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(traces, tmp_path, capsys, args, message):
    argv = [a.format(naive=traces["naive"]) for a in args] + ["-o", str(tmp_path / "x.html")]
    code, _, err = run_cli(capsys, *argv)
    err = without_progress(err)  # a loaded machine may make the read last past the progress line's 3 s
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "x.html").exists()


def test_a_report_file_gets_the_export_command(tmp_path, capsys):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"not really a report")
    code, _, err = run_cli(capsys, rep, "-o", tmp_path / "x.html")
    assert code == 2 and f"nsys export --type sqlite -o {tmp_path / 'run.sqlite'} {rep}" in err
    assert "--export" in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "x.html").exists()


def test_refuses_to_overwrite_an_input_or_write_non_html(traces, capsys):
    before = traces["naive"].read_bytes()
    code, _, err = run_cli(capsys, traces["naive"], "-o", traces["naive"])
    assert code == 2 and "HTML" in err
    assert traces["naive"].read_bytes() == before
    with pytest.raises(SystemExit) as exit_:
        timeline.main([str(traces["naive"]), "-o", "x.html", "--width", "5"])
    assert exit_.value.code == 2 and "--width 5" in capsys.readouterr().err


def test_default_output_never_replaces_a_foreign_page(traces, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "timeline.html").write_text("<html>mine</html>")
    code, _, err = run_cli(capsys, traces["naive"])
    assert code == 2 and "not written by this tool" in err
    assert (tmp_path / "reports" / "timeline.html").read_text() == "<html>mine</html>"
    (tmp_path / "reports" / "timeline.html").unlink()
    assert run_cli(capsys, traces["naive"])[0] == 0
    assert run_cli(capsys, traces["naive"])[0] == 0  # its own page it may replace


@pytest.mark.parametrize("extra", [[], ["--self-contained"]])
def test_an_explicit_output_never_replaces_a_foreign_page(traces, tmp_path, capsys, extra):
    mine = tmp_path / "mine.html"
    mine.write_text("<html>my notes</html>")
    code, out, err = run_cli(capsys, traces["naive"], "-o", mine, *extra)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "mine.html: exists and was not written by this tool" in lines[0]
    assert mine.read_text() == "<html>my notes</html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.html"]  # nothing written beside it either


def test_an_explicit_output_replaces_its_own_page(traces, tmp_path, capsys):
    page = tmp_path / "t.html"
    assert run_cli(capsys, traces["naive"], "-o", page)[0] == 0
    assert run_cli(capsys, traces["overlap"], "-o", page)[0] == 0
    assert "overlap.sqlite" in page.read_text()


def test_help_names_the_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        timeline.main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "--step" in out and "--format" in out


@pytest.mark.subprocess  # a subprocess: `python -m analysis.timeline` and its exit code
def test_module_entry_point():
    done = subprocess.run(
        [sys.executable, "-m", "analysis.timeline", "README.md", "-o", "/tmp/never.html"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.strip() == "error: README.md: not an SQLite file"


@pytest.mark.real  # a whole real H100 trace, end to end
@pytest.mark.skipif(not REAL.exists(), reason="real trace not present (../shared/data)")
def test_real_h100_trace(tmp_path, capsys):
    code, stdout, _ = run_cli(capsys, REAL, "-o", tmp_path / "real.html", "--format", "json")
    assert code == 0
    row = json.loads(stdout)[0]
    assert row["ranks"] == 2 and row["overlap_pct"] == 0.0  # NCCL runs on the compute stream here
    panel = build_panel(measure_run(load_trace(REAL)), Selection())
    labels = panel.lanes["label"].tolist()
    assert "r0 GPU s7 compute" in labels and "r1 GPU s15 comm" in labels
    seg = panel.segments  # the whole run (build_panel without an opening step)
    comm = seg.loc[(seg["src"] == FROM_GPU) & (seg["group"] == GPU_COMM)]
    assert comm["name"].str.startswith("ncclDevKernel_SendRecv").all() and len(comm) == 66
    assert set(comm["category"]) == {"comm:other"}  # send/recv: no collective of its own
    assert np.isin(["comm:other", "nvtx"], seg["category"].unique()).all()  # NCCL's own ranges: send/recv


def _fake_kaleido(monkeypatch, calls, fail=False):
    """kaleido's one-session writer replaced: records each spec, writes b'image from us' or fails."""
    import kaleido

    def write(specs, kopts):
        calls.extend(specs)
        if fail:
            return (RuntimeError("Chromium crashed\nmore detail"),)
        for spec in specs:
            Path(spec["path"]).write_bytes(b"image from us")
        return ()

    monkeypatch.setattr(kaleido, "write_fig_from_object_sync", write)
    monkeypatch.setattr("analysis.render.export.find_chromium", lambda: "/usr/bin/chromium")


@pytest.mark.pages  # writes three whole pages
def test_images_are_width_wide_and_replaced_only_when_they_pair_with_our_page(traces, tmp_path, capsys, monkeypatch):
    pytest.importorskip("kaleido")
    calls: list = []
    _fake_kaleido(monkeypatch, calls)
    out, png, svg = tmp_path / "t.html", tmp_path / "t.png", tmp_path / "t.svg"
    png.write_bytes(b"someone's png")
    code, _, err = run_cli(capsys, traces["naive"], "-o", out, "--png", "--width", 900)
    assert code == 2 and "t.png: exists and was not written by this tool" in err and len(err.strip().splitlines()) == 1
    assert png.read_bytes() == b"someone's png" and calls == [] and not out.exists()  # refused before any work
    png.unlink()
    assert run_cli(capsys, traces["naive"], "-o", out, "--png", "--svg", "--width", 900)[0] == 0
    assert png.read_bytes() == svg.read_bytes() == b"image from us"
    assert [c["opts"]["format"] for c in calls] == ["png", "svg"] and calls[-1]["opts"]["width"] == 900
    assert run_cli(capsys, traces["naive"], "-o", out, "--png")[0] == 0  # pairs with our page: replaced
    assert len(calls) == 3 and calls[-1]["opts"]["width"] == 1600


def test_image_failure_is_one_line_and_exit_2(traces, tmp_path, capsys, monkeypatch):
    pytest.importorskip("kaleido")
    _fake_kaleido(monkeypatch, [], fail=True)
    code, _, err = run_cli(capsys, traces["naive"], "-o", tmp_path / "t.html", "--png")
    assert code == 2 and (tmp_path / "t.html").exists() and not (tmp_path / "t.png").exists()
    assert "image export failed: RuntimeError: Chromium crashed" in err and "Traceback" not in err
    assert "more detail" not in err


def test_without_chromium_images_are_refused_before_any_work(traces, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("analysis.render.export.find_chromium", lambda: None)
    code, _, err = run_cli(capsys, traces["naive"], "-o", tmp_path / "t.html", "--svg")
    assert code == 2 and "--svg: needs a system Chromium" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t.html").exists()


def test_the_figure_does_not_merge_a_panel_again_at_the_same_resolution(measured, monkeypatch):
    from analysis.timeline import figure

    panel = build_panel(measured["overlap"][0], Selection(), width_px=800, opening_step=1)
    calls = []
    real = figure.merge_subpixel
    monkeypatch.setattr(figure, "merge_subpixel", lambda seg, px: calls.append(px) or real(seg, px))
    same = figure.build_figure([panel], width_px=800)
    levels = [panel, panel.overview]  # the opening step and the whole run
    drawn = sum(len(level.segments) for level in levels)
    hover_only = [level.merged_pixel_ns * figure.HOVER_PX for level in levels]
    assert calls and set(calls) <= set(hover_only) and figure.count_drawn_segments(same) == drawn
    calls.clear()
    figure.build_figure([panel], width_px=400)  # a coarser view still merges its lines
    assert {level.merged_pixel_ns * 2 for level in levels} <= set(calls)
