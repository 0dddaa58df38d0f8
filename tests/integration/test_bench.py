"""The benchmarks in tools/bench/, run quick: each prints its table, writes its JSON and measures
every case it reports (speed itself is never asserted here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tools.bench.__main__ import main as bench


def test_bench_core_when_run_quick_prints_table_and_writes_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(["core", "--quick", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "cls c=1 infer() p50" in table and "batching off" in table
    results = json.loads((tmp_path / "core.json").read_text())
    assert set(results["latency"]) == {"cls", "cls_1t", "tiny_cls"}
    assert results["throughput"]["cls_delay"]["mean_batch"] > 1  # batches really formed


def test_bench_api_when_run_quick_measures_every_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(["api", "--quick", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "PP-OCR det 1x3x640x640" in table and "edged, Unix socket, binary" in table
    results = json.loads((tmp_path / "api.json").read_text())
    for model in ("tiny_cls", "det"):
        row = results["latency"][model]
        assert row["direct"]["p50_ms"] > 0 and row["socket"]["p50_ms"] > 0
        assert row["shm"]["p50_ms"] > 0
    assert results["rates"]["edged_socket_binary"]["c8"]["requests_per_s"] > 0
    # edged chose each model's intra-op threads at its first load; the direct sessions follow
    assert set(results["threads"]) == {"tiny_cls", "cls", "det"}
    assert all(n >= 1 for n in results["threads"].values())
    assert "intra-op threads, as edged chose them" in table
    if results["yardstick"]["perf_analyzer"] is not None:  # `make bench-setup` was run
        cached = [row["cached_tcp"] for row in results["yardstick"]["rows"]
                  if "cached_tcp" in row]
        assert len(cached) == 4 and all(c["hit"] > c["miss"] >= 1 for c in cached)
        assert "response cache on, one input repeated" in table


def test_bench_describer_when_run_quick_measures_both_sides(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(["describer", "--quick", "--out", str(tmp_path)]) == 0
    assert "describe off vs on" in capsys.readouterr().out
    results = json.loads((tmp_path / "describer.json").read_text())
    rows, submit = results["stream"][:-1], results["stream"][-1]
    assert [r["objects"] for r in rows] == [5, 50]
    assert all(r["off_ms"] > 0 and r["on_ms"] > 0 for r in rows)
    assert submit["submit_us"] > 0 and submit["endpoint_errors"] > 0
    local = results["local"]  # SmolLM2 as the describer: every event described, then cached
    assert local["described"] == local["events"] == 3 and local["cache_hits"] == 3


def test_bench_llm_when_run_quick_measures_both_paths_on_the_same_prompts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(["llm", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| edged / direct |" in out and "the batching gain" in out
    results = json.loads((tmp_path / "llm.json").read_text())
    for side in ("direct", "edged"):
        rows = results[side]
        assert len(rows) == results["rounds"] == 3
        # greedy on the same prompts: both generate the same number of tokens
        assert all(r["tokens"] > 1 and r["ttft_s"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    assert [r["tokens"] for r in results["direct"]] == [r["tokens"] for r in results["edged"]]
    batching = results["batching"]  # four chats at once, batched and queued, both measured
    for side in ("on", "off"):
        assert len(batching[side]) == batching["rounds"] == 2
        assert all(r["tokens"] > r["clients"] == 4 and len(r["ttft_ms"]) == 4
                   for r in batching[side])
    assert batching["gain"] > 0
    beside = results["beside_streams"]  # four streams: no chat, a chat yielding, one not
    assert all(beside[kind]["fps"] > 0 and len(beside["rows"][kind]) == beside["rounds"]
               for kind in ("alone", "yield_on", "yield_off"))
    assert beside["counters"]["smol_off"]["yields"] == 0  # its switch off: it never waits


@pytest.mark.timeout(300)  # four stream cases and the live views, each run for real
def test_bench_streams_when_run_quick_measures_every_case_at_a_real_subscriber(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    assert bench(["streams", "--quick", "--out", str(tmp_path)]) == 0
    assert "achieved / model-bound" in capsys.readouterr().out
    results = json.loads((tmp_path / "streams.json").read_text())
    assert results["broker"] == "private mosquitto"
    assert [(c["streams"], c["in_flight"]) for c in results["cases"]] == [(1, 2), (2, 2),
                                                                          (4, 2), (4, 1)]
    for case in results["cases"]:
        assert case["achieved_fps"] > 0 and case["latency"]["p50_ms"] > 0
        assert len(case["per_stream_fps"]) == case["streams"]  # every stream got results
    live = {c["viewers"]: c for c in results["live"]["cases"]}
    assert sorted(live) == [0, 1, 3]
    assert live[0]["pictures_s"] == 0 and live[0]["parts_per_viewer_s"] == 0  # unwatched
    assert live[1]["parts_per_viewer_s"] > 0 and live[3]["pictures_s"] > 0
    assert all(c["processed_fps"] > 0 and c["pipeline_ms_per_frame"] > 0 for c in live.values())


def test_bench_ota_when_run_quick_updates_under_load_without_a_failed_request(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    assert bench(["ota", "--quick", "--out", str(tmp_path)]) == 0
    assert "received->active" in capsys.readouterr().out
    results = json.loads((tmp_path / "ota.json").read_text())
    assert [c["model"] for c in results["cases"]] == ["cls", "det"]
    for case in results["cases"]:
        (update,) = case["rounds"]
        assert all(update[p]["requests"] > 0 and update[p]["failed"] == 0
                   for p in ("before", "after"))
        assert update["during"]["failed"] == 0 and update["received_to_active_s"] > 0
        assert set(update["answers_by_version"]) == {"1", "2"}  # both served, under load
    cost, promotion = results["shadow"]["cost"], results["shadow"]["promotion"]
    assert all(cost[p]["requests"] > 0 and cost[p]["failed"] == 0
               for p in ("without", "with_shadow", "without_after"))
    assert promotion["failed"] == 0 and promotion["shadow"]["state"] == "promoted"
    assert promotion["shadow"]["samples"] >= promotion["min_samples"]
    assert promotion["pushed_to_promoted_s"] > promotion["pushed_to_shadowing_s"] > 0


def test_bench_soak_when_run_briefly_meets_every_fault_and_reports_each_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    assert bench(["soak", "--minutes", "0.5", "--out", str(tmp_path)]) == 0
    assert "p99 within 1.5x of the first window" in capsys.readouterr().out
    r = json.loads((tmp_path / "soak.json").read_text())
    kinds = [f["kind"] for f in r["faults"]]
    assert kinds.count("burst") == kinds.count("ota") == len(r["windows"]) == 3
    assert kinds.count("broker") == 1
    s = r["summary"]  # the faults were met, and none of them cost a request or a frame
    assert s["failed_requests"] == s["failed_frames"] == s["failed_updates"] == 0, r["errors"]
    assert s["bad_requests_answered_wrong"] == 0, r["faults"]
    assert all(w["requests"] > 0 for w in r["windows"]) and r["streams"]["processed:colors"] > 0
    # CPU per window where a window holds a sample (a 10-s window may be all fault):
    measured = [w for w in r["windows"] if "cpu_percent" in w]
    assert measured and all(w["cpu_percent"] > 0 and w["cpu_ms_per_request"] > 0
                            for w in measured)
    assert set(r["checks"]) == {"0 failed requests outside the faults",
                                "RSS trend once settled <= 2% an hour", "fd count flat",
                                "p99 within 1.5x of the first window"}


def test_bench_differential_when_run_briefly_compares_both_daemons_answers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(["differential", "--minutes", "0.2", "--seed", "7", "--out",
                  str(tmp_path)]) == 0
    assert "MISMATCHES 0" in capsys.readouterr().out
    r = json.loads((tmp_path / "differential.json").read_text())
    assert r["seed"] == 7 and r["requests"] > 100 and r["mismatches"] == 0, r["examples"]
    assert r["statuses"].get("200", 0) > 0 and r["statuses"].get("400", 0) > 0


def test_bench_masks_when_run_quick_gives_ultralytics_polygons_from_box_windows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(["masks", "--quick", "--out", str(tmp_path)]) == 0
    assert "polygons equal within 1 px: yes" in capsys.readouterr().out
    results = json.loads((tmp_path / "masks.json").read_text())
    assert results["kept"] == 20 and results["polygons_equal_1px"]
    assert results["same_as_before"] and results["rle_same"]  # the one-pass paths' answers
    assert results["bounded_points_max"] <= results["mask_points"] < results["points_max"]
    assert results["ultralytics_ms"] > 0 and results["edged_ms"] > 0
    assert results["before_ms"] > 0 and results["rle_ms"] > 0
    for size, objects in (("640x480", 20), ("1920x1080", 20), ("640x480, 5 objects", 5),
                          ("1920x1080, 5 objects", 5)):
        streams = results["streams"][size]
        assert streams["seg"]["masks"] == streams["det"]["detections"] == objects
        assert streams["seg_over_det"] > 0 and streams["premasked_over_det"] > 0
        assert streams["seg_premasked"]["masks"] == objects


def test_bench_post_when_run_quick_keeps_the_same_detections_before_and_after(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(["post", "--quick", "--out", str(tmp_path)]) == 0
    assert "NMS alone, crowd (numpy loop vs OpenCV)" in capsys.readouterr().out
    results = json.loads((tmp_path / "post.json").read_text())
    assert [c["scene"] for c in results["yolov8"]] == ["12 objects", "crowd of 100",
                                                       "12 objects"]
    for case in results["yolov8"]:
        assert case["same_kept"] and case["before_ms"] > 0 and case["after_ms"] > 0
        assert case["candidates"] > case["kept"] > 0  # NMS had candidates to suppress
    assert results["nms"]["same_kept"] and results["end2end"]["kept"] > 0


def test_bench_shmviews_when_run_quick_times_views_against_pread_copies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(["shmviews", "--quick", "--out", str(tmp_path)]) == 0
    assert "shm, pread copies" in capsys.readouterr().out
    r = json.loads((tmp_path / "shmviews.json").read_text())
    for model in ("tiny_cls", "det"):  # each path answered right (checked) and was timed
        assert all(r[model][path]["p50_ms"] > 0 for path in ("direct", "views", "copies"))


def test_bench_fleet_when_run_quick_rolls_out_to_every_simulated_device_and_counts_messages(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    assert bench(["fleet", "--quick", "--out", str(tmp_path)]) == 0
    assert "PUBLISH in" in capsys.readouterr().out
    results = json.loads((tmp_path / "fleet.json").read_text())
    waves, fleet = results["cases"]
    assert (waves["mode"], waves["devices"], fleet["mode"]) == ("waves", 20, "fleet")
    # Every device of every wave reached active (push_waves says healthy only then).
    assert sum(w["devices"] for w in waves["waves"]) == 20
    assert all("seconds" in w for w in waves["waves"])
    # Each device: its manifest (waves: one each; fleet: one for all) and six status events.
    assert (waves["manifests"], waves["statuses"]) == (20, 20 * 6)
    assert (fleet["manifests"], fleet["statuses"]) == (1, 20 * 6)
    for case in (waves, fleet):  # every status went to the pusher that follows them
        assert case["publish_out"] >= case["statuses"]


@pytest.mark.timeout(300)
def test_bench_gpu_when_no_gpu_skips_the_gpu_cases_and_dry_runs_the_rest_on_the_cpu(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    assert bench(["gpu", "--quick", "--out", str(tmp_path)]) == 0
    assert "DRY RUN on the CPU EP (no GPU numbers)" in capsys.readouterr().out
    results = json.loads((tmp_path / "gpu.json").read_text())
    assert results["dry_run"] and results["providers"] == ["cpu"]
    assert "skipped" in results["copies"] and "skipped" in results["cuda_vs_cpu"]
    assert [(r["model"], r["clients"]) for r in results["batching"]] == [
        (m, c) for m in ("cls", "yolo") for c in (1, 8, 16)]
    assert all(r["on_per_s"] > 0 and r["off_per_s"] > 0 for r in results["batching"])
    assert [(r["model"], r["clients"]) for r in results["edged_vs_direct"]] == [
        (m, c) for m in ("cls", "yolo") for c in (1, 8)]
    (stream,) = results["pipeline"]  # the model on the CPU EP: one case, not two
    assert stream["model_on"] == "CPUExecutionProvider" and stream["frames"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_gate_when_run_quick_plays_each_real_clip_gated_and_not(
        real_models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(["gate", "--quick", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "gated / ungated" in table and "what subscribers learnt" in table
    results = json.loads((tmp_path / "gate.json").read_text())
    assert set(results["clips"]) == {"door", "carphone"}
    for clip in results["clips"].values():
        ungated, gated = clip["runs"]["ungated"], clip["runs"]["gated"]
        assert ungated["calls"] == ungated["frames"] == gated["frames"]  # every frame counted
        assert gated["calls"] + gated["gated"] == gated["frames"]
        assert clip["max_lag_frames"] is not None  # both runs told the same story to compare
    assert results["clips"]["door"]["runs"]["gated"]["gated"] > 0
    assert len(results["gate_cost"]) == 4 and results["model_compute_ms"] > 0
    assert all(c["p50_us"] > 0 for c in results["gate_cost"].values())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_recording_when_run_quick_measures_the_recorder_the_readers_and_pre_capture(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(["recording", "--quick", "--out", str(tmp_path)]) == 0
    assert "pre-capture delivered" in capsys.readouterr().out
    results = json.loads((tmp_path / "recording.json").read_text())
    assert results["recording"]["clips"] >= 1 and results["recording"]["cpu_s"] > 0
    reader = results["reader"]
    assert reader["frames"] == reader["opencv_frames"] == reader["packets_recorded"] > 0
    assert all(v > 0 for v in reader["cpu_ms_per_frame"].values())
    pre = results["pre_capture"]
    assert pre["edged"]["short"] == 0 and pre["edged"]["min"] >= pre["asked_s"]
    assert pre["next_keyframe"]["short"] > 0  # the policy edged improves on, measured alike
    rows = results["cameras"]
    assert [r["cameras"] for r in rows][:1] == [1] and all(r["cpu_cores"] > 0 for r in rows)


def test_bench_classify_when_run_quick_times_the_crop_with_the_same_tensor_as_a_whole_resize(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(["classify", "--quick", "--out", str(tmp_path)]) == 0
    assert "Ultralytics classifier pre-processing" in capsys.readouterr().out
    results = json.loads((tmp_path / "classify.json").read_text())
    assert [c["frame"] for c in results["cases"]] == ["640x480", "1280x720"]
    for case in results["cases"]:
        assert case["same_tensor"]
        assert all(case[p]["median_ms"] > 0 for p in ("squash", "crop", "crop, whole resize"))
