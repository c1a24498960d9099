"""Media that would kill the process or exhaust memory (issue 28 item 16), and video rotation (item 25).

Headers are the attacker's to write: an 8 KB AVI that declares 2**31 - 1 frames aborts a process that hands it
to decord (SIGABRT from std::bad_alloc, uncatchable), so anything that may reach decord runs in a subprocess
here. Images are refused from their header by side and aspect ratio as well as by area; video files decode only
the frames a reward samples.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from mmreward import media
from mmreward.errors import MediaError, RewardInputError
from tests.mmreward.test_media import png_header_only

av = pytest.importorskip("av")
ROOT = Path(__file__).resolve().parents[2]
HAS_DECORD = "decord" in media.available_video_backends()


def _write_clip(path: Path, n: int, size: int = 32, *, rotation: int | None = None, codec: str = "mpeg4",
                rate: int = 8, width: int | None = None) -> np.ndarray:
    """A clip whose frame i has level (7 * i) % 256 in green and a white block at the top-left; returns the frames."""
    w = width or size
    frames = np.zeros((n, size, w, 3), np.uint8)
    frames[..., 1] = ((7 * np.arange(n)) % 256)[:, None, None]
    frames[:, : size // 2, : w // 3] = 255
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = w, size, "yuv420p"
        if rotation is not None:
            stream.set_display_rotation(rotation)
        for arr in frames:
            for pkt in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                out.mux(pkt)
        for pkt in stream.encode():
            out.mux(pkt)
    return frames


def _avi_bomb(path: Path, frames: int = 2**31 - 1) -> Path:
    """A valid 4-frame AVI whose headers (avih dwTotalFrames, strh dwLength, OpenDML dmlh) claim `frames`."""
    _write_clip(path, 4, 16)
    data = bytearray(path.read_bytes())
    assert data[24:28] == b"avih"  # RIFF, size, 'AVI ', LIST, size, 'hdrl', then the main header
    struct.pack_into("<I", data, 32 + 16, frames)  # MainAVIHeader.dwTotalFrames
    strh = data.find(b"strh")
    struct.pack_into("<I", data, strh + 8 + 32, frames)  # AVIStreamHeader.dwLength
    dmlh = data.find(b"dmlh")
    if dmlh >= 0:
        struct.pack_into("<I", data, dmlh + 8, frames)  # ODMLExtendedAVIHeader.dwTotalFrames
    path.write_bytes(bytes(data))
    return path


def _run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(ROOT))


# ----------------------------------------------------------------------------------------------
# videos: headers checked before any decoder allocates
# ----------------------------------------------------------------------------------------------
def test_avi_declaring_2_31_frames_is_a_media_error_in_every_backend_without_abort(tmp_path):
    bomb = _avi_bomb(tmp_path / "bomb.avi")
    assert bomb.stat().st_size < 16_000
    with av.open(str(bomb)) as c:
        assert c.streams.video[0].frames == 2**31 - 1  # what FFmpeg reads from it
    if HAS_DECORD:  # the threat is real: decord itself kills the process on this file
        raw = _run_python(f"import decord; decord.VideoReader({str(bomb)!r})")
        assert raw.returncode < 0 and "bad_alloc" in raw.stderr
    code = f"""
        import resource, json
        from mmreward import media
        from mmreward.errors import MediaError
        out = {{}}
        for backend in ["auto", *media.available_video_backends()]:
            for sampling in ("uniform", "all"):
                before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                try:
                    media.read_video({str(bomb)!r}, num_frames=4, sampling=sampling, backend=backend)
                    out[backend + sampling] = "decoded"
                except MediaError as exc:
                    out[backend + sampling] = str(exc)
                out[backend + sampling + "_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(json.dumps(out))
    """
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key, value in out.items():
        if key.endswith("_rss_kb"):
            assert value < 50_000, (key, value)  # no per-frame allocation (2**31 indices alone are 17 GB)
        else:
            assert "declares 2147483647 frames" in value and "max_video_frames=100000" in value, (key, value)


def test_sampling_all_frames_of_the_bomb_allocates_nothing_in_process(tmp_path):
    bomb = _avi_bomb(tmp_path / "bomb.avi")
    tracemalloc.start()
    try:
        with pytest.raises(MediaError, match="max_video_frames"):
            media.read_video(bomb, sampling="all", backend="av")  # was list(range(2**31))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000


def test_declared_duration_and_frame_limits_are_options(tmp_path):
    clip = tmp_path / "c.mp4"
    _write_clip(clip, 12)  # 1.5 s at 8 fps
    assert media.read_video(clip, num_frames=3, backend="av").shape == (3, 3, 32, 32)
    with pytest.raises(MediaError, match=r"declares 12 frames, above max_video_frames=11"):
        media.read_video(clip, num_frames=3, max_video_frames=11)
    with pytest.raises(MediaError, match=r"max_video_seconds=1"):
        media.read_video(clip, num_frames=3, max_video_seconds=1)
    assert media.read_video(clip, num_frames=3, max_video_frames=12, max_video_seconds=1.5).shape[0] == 3
    with pytest.raises(MediaError, match=r"3 sampled frames of 32x32 are 3072 pixels, above max_decoded_pixels"):
        media.read_video(clip, num_frames=3, max_decoded_pixels=3071)
    webm = tmp_path / "c.webm"  # no frame count in the header: packets are counted, up to the limit
    try:
        _write_clip(webm, 12, codec="libvpx")
    except Exception as exc:  # noqa: BLE001 - an encoder missing from this PyAV build
        pytest.skip(f"cannot encode webm here: {exc}")
    with pytest.raises(MediaError, match="max_video_frames=11"):
        media.read_video(webm, num_frames=3, max_video_frames=11, backend="av")
    assert media.read_video(webm, num_frames=3, max_video_frames=12, backend="av").shape[0] == 3


def test_video_frames_over_the_image_side_cap_are_refused_from_the_header(tmp_path):
    clip = tmp_path / "wide.mp4"
    _write_clip(clip, 2, size=16, width=16 * 66)  # 66:1
    with pytest.raises(MediaError, match="max_aspect_ratio=64"):
        media.read_video(clip)
    assert media.read_video(clip, max_aspect_ratio=None, backend="av").shape == (2, 3, 16, 16 * 66)


# ----------------------------------------------------------------------------------------------
# videos: only the sampled frames are decoded
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def long_clip(tmp_path_factory) -> tuple[Path, np.ndarray]:
    path = tmp_path_factory.mktemp("long") / "long.mp4"
    _write_clip(path, 1500, size=96)
    _write_clip(path.with_name("short.mp4"), 4, size=96)  # warms the decoders up before a measurement
    with av.open(str(path)) as c:  # the reference decode: every frame with PyAV directly
        every = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    assert every.shape == (1500, 96, 96, 3) and path.stat().st_size < 200_000
    return path, every


def test_sampling_8_of_1500_frames_decodes_with_bounded_memory(long_clip):
    path, _ = long_clip
    # VmHWM, the peak of this process image: ru_maxrss survives exec on Linux, so a child forked from a large
    # pytest worker starts at the worker's peak and a full decode below it registers as 0. One child measures
    # every case (one torch import, not one per case): writing 5 to /proc/self/clear_refs resets the peak to the
    # current RSS before each; the sampled cases go first, so no freed full decode is there for them to reuse
    probe = """
        import gc
        import json
        from mmreward import media

        def hwm_kb():
            with open("/proc/self/status") as f:
                return int(next(line for line in f if line.startswith("VmHWM")).split()[1])

        runs = {{}}
        for name, kwargs in {cases!r}:
            x = media.read_video({short!r}, **kwargs)  # loads the decoders, so that what follows measures frames
            del x
            gc.collect()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            before = hwm_kb()
            x = media.read_video({long!r}, **kwargs)
            runs[name] = {{"shape": list(x.shape), "rss_kb": hwm_kb() - before}}
            del x
            gc.collect()
        print(json.dumps(runs))
    """
    cases = [(b, {"num_frames": 8, "backend": b}) for b in media.available_video_backends()]
    cases.append(("full", {"backend": "av"}))
    proc = _run_python(probe.format(cases=cases, short=str(path.with_name("short.mp4")), long=str(path)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert runs.keys() == {name for name, _ in cases}
    full_float_kb = 1500 * 96 * 96 * 3 * 4 / 1024  # 162 MiB as float32
    assert runs["full"]["shape"] == [1500, 3, 96, 96]
    assert runs["full"]["rss_kb"] > full_float_kb, runs  # the yardstick: a full decode registers
    for name, run in runs.items():
        if name != "full":
            assert run["shape"] == [8, 3, 96, 96]
            assert run["rss_kb"] < full_float_kb / 10, runs  # eight frames are 0.9 MB


def test_a_video_reward_decodes_only_its_sampled_frames(long_clip):
    """Reward.prepare on a file: numpy buffers (traced by tracemalloc) hold 8 frames, not 1,500 (41 MB as uint8)."""
    import mmreward

    path, _ = long_clip
    reward = mmreward.load("motion", num_frames=8)
    reward.prepare([path.with_name("short.mp4")])
    tracemalloc.start()
    try:
        batch = reward.prepare([path])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert batch.shape == (1, 8, 3, 96, 96)
    assert peak < 4_000_000, peak


def test_sampled_frames_and_scores_are_those_of_the_full_decode(long_clip):
    import mmreward

    path, every = long_clip
    idx = np.linspace(0, 1499, 8).round().astype(int)  # FrameAggregate/Motion's rule, written out
    expected = torch.from_numpy(every[idx]).permute(0, 3, 1, 2).float() / 255
    reward = mmreward.load("motion", num_frames=8)
    prepared = reward.prepare([path])
    assert torch.equal(prepared[0], expected)
    full = torch.from_numpy(every).permute(0, 3, 1, 2).float()[None] / 255
    assert torch.equal(reward.score(None, [path]).scores, reward.score(None, full).scores)
    if HAS_DECORD:  # decord: one get_batch of the sampled indices, the same frames (different decoder rounding)
        got = media.read_video(path, backend="decord", frame_indices=lambda total, rate: idx.tolist())
        assert (got - expected).abs().max() <= 2 / 255


# ----------------------------------------------------------------------------------------------
# images: each side and the aspect ratio, from the header
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("width", "height", "match"), [
    (1, 1_000_000, "max_image_side=16384"),
    (80_000, 1, "max_image_side=16384"),
    (10_000, 1, "aspect ratio of 10000:1, above max_aspect_ratio=64"),
])
def test_extreme_images_are_refused_from_the_header(tmp_path, monkeypatch, width, height, match):
    strip = png_header_only(tmp_path / "strip.png", width, height)

    def no_decode(self):
        raise AssertionError("the image was decoded before the size check")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decode)
    with pytest.raises(MediaError, match=match):
        media.read_image(strip)
    with pytest.raises(MediaError, match=rf"media\[0\].*{match}"):
        media.to_batch([strip])
    with pytest.raises(MediaError, match=match):
        media.load_image(Image.open(strip))


def test_side_and_aspect_caps_are_inclusive_options(tmp_path):
    ok = tmp_path / "ok.png"
    Image.new("RGB", (640, 10)).save(ok)  # 64:1, the bound itself
    assert media.load_image(ok).shape == (3, 10, 640)
    wide = tmp_path / "wide.png"
    Image.new("RGB", (650, 10)).save(wide)
    with pytest.raises(MediaError, match="max_aspect_ratio=64"):
        media.load_image(wide)
    assert media.load_image(wide, max_aspect_ratio=None).shape == (3, 10, 650)
    with pytest.raises(MediaError, match="max_image_side=600"):
        media.to_batch([wide], max_image_side=600, max_aspect_ratio=None)
    with pytest.raises(RewardInputError, match="max_image_side: expected a positive int"):
        media.to_batch([ok], max_image_side=0)
    with pytest.raises(RewardInputError, match="max_aspect_ratio: expected a number >= 1"):
        media.to_batch([ok], max_aspect_ratio=0.5)


def test_jpeg_rewards_refuse_sides_jpeg_cannot_encode_with_a_media_error():
    import mmreward

    reward = mmreward.load("jpeg-compressibility")
    with pytest.raises(MediaError, match="65500"):
        reward.score(None, torch.zeros(1, 3, 1, 65_501))  # PIL: a bare OSError
    from mmreward.errors import ConfigError

    with pytest.raises(ConfigError, match="quality"):
        mmreward.load("jpeg-compressibility", quality=0)


def test_an_unreadable_item_whatever_it_raises_is_that_items_media_error(tmp_path, monkeypatch):
    good = tmp_path / "a.png"
    Image.new("RGB", (4, 4)).save(good)

    def broken(*args, **kwargs):
        raise MemoryError("decoder ran out")

    monkeypatch.setattr(media, "read_image", broken)
    with pytest.raises(MediaError, match=r"media\[0\]: cannot read .*a.png: MemoryError: decoder ran out"):
        media.to_batch([good])


# ----------------------------------------------------------------------------------------------
# the CLI records a bad item and scores the rest
# ----------------------------------------------------------------------------------------------
def test_cli_records_hostile_items_and_scores_the_rest(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for i in range(3):
        Image.new("RGB", (8, 8), (60 * i, 0, 0)).save(images / f"img{i}.png")
    png_header_only(images / "img1_strip.png", 1, 1_000_000)
    videos = tmp_path / "videos"
    videos.mkdir()
    _write_clip(videos / "a_ok.mp4", 40, 16)
    _avi_bomb(videos / "b_bomb.avi")
    (videos / "c_garbage.mp4").write_bytes(b"not a video")
    runs = {name: ["score", *argv, "--out", str(tmp_path / f"{name}.jsonl"), "--no-progress"] for name, argv in (
        ("images", ["--reward", "jpeg-incompressibility", str(images)]),
        ("videos", ["--reward", "motion", "--option", "num_frames=8", str(videos)]))}
    # both `python -m mmreward score` runs in one interpreter (runpy, as -m does; torch is imported once): each
    # exit code and stderr is captured on its own; an abort in a decoder would still end the process (rc < 0)
    proc = _run_python(f"""
        import contextlib, io, json, runpy, sys, warnings
        warnings.simplefilter("always")
        res = {{}}
        for name, argv in {runs!r}.items():
            sys.argv = ["mmreward", *argv]
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                try:
                    runpy.run_module("mmreward", run_name="__main__", alter_sys=True)
                    rc = 0
                except SystemExit as exc:
                    rc = 0 if exc.code is None else exc.code
            res[name] = [rc, err.getvalue()]
        print(json.dumps(res))
    """, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = {}
    for name, (rc, err) in json.loads(proc.stdout.strip().splitlines()[-1]).items():
        assert rc == 1, (name, err[-2000:])  # some items failed; no abort, no traceback
        assert "item(s) failed" in err and "Traceback" not in err, (name, err[-2000:])
        out = tmp_path / f"{name}.jsonl"
        results[name] = {Path(r["media"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    imgs = results["images"]
    assert sorted(imgs) == ["img0.png", "img1.png", "img1_strip.png", "img2.png"]
    assert "max_image_side=16384" in imgs["img1_strip.png"]["error"] and imgs["img1_strip.png"]["score"] is None
    assert all(isinstance(imgs[f"img{i}.png"]["score"], float) for i in range(3))
    vids = results["videos"]
    assert sorted(vids) == ["a_ok.mp4", "b_bomb.avi", "c_garbage.mp4"]
    assert vids["a_ok.mp4"]["error"] is None and vids["a_ok.mp4"]["score"] > 0
    assert "declares 2147483647 frames" in vids["b_bomb.avi"]["error"]
    assert "cannot decode video" in vids["c_garbage.mp4"]["error"]


# ----------------------------------------------------------------------------------------------
# rotation metadata (item 25)
# ----------------------------------------------------------------------------------------------
def _ffmpeg_autorotate(frame: av.VideoFrame) -> np.ndarray:
    """FFmpeg's own display of a rotated frame, through its filters as the ffmpeg tool picks them.

    FFmpeg fftools (cmdutils.c get_rotation, ffmpeg_filter.c configure_input_video_filter, FFmpeg/FFmpeg@n6.1):
    theta = -av_display_rotation_get(matrix), normalised to [0, 360); 90 -> transpose=clock,
    180 -> hflip + vflip, 270 -> transpose=cclock. Run here with FFmpeg's filters via PyAV's filter graph on
    the RGB frame, so that the rotation is a pure pixel permutation of what the decoder produced.
    """
    theta = -float(frame.rotation)
    theta -= 360 * np.floor(theta / 360 + 0.9 / 360)
    rgb = frame.reformat(format="rgb24")
    chain = {90: [("transpose", "clock")], 180: [("hflip", None), ("vflip", None)],
             270: [("transpose", "cclock")]}.get(int(round(theta)) % 360, [])
    if not chain:
        return rgb.to_ndarray()
    graph = av.filter.Graph()
    node = graph.add_buffer(width=rgb.width, height=rgb.height, format="rgb24", time_base="1/8")
    src = node
    for name, arg in chain:
        nxt = graph.add(name, arg) if arg else graph.add(name)
        node.link_to(nxt)
        node = nxt
    sink = graph.add("buffersink")
    node.link_to(sink)
    graph.configure()
    src.push(rgb)
    return sink.pull().to_ndarray()


@pytest.mark.parity
@pytest.mark.parametrize("rotation", [90, 180, -90])
def test_rotated_clips_are_decoded_upright_as_ffmpeg_displays_them(tmp_path, rotation):
    from tests._helpers.parity_record import record_parity

    clip = tmp_path / f"r{rotation}.mp4"
    _write_clip(clip, 6, size=16, width=24, rotation=rotation)
    with av.open(str(clip)) as c:
        decoded = list(c.decode(video=0))
        assert (decoded[0].rotation - rotation) % 360 == 0  # the display matrix is in the file (180 reads -180)
        idx = [0, 2, 3, 5]
        expected = np.stack([_ffmpeg_autorotate(decoded[i]) for i in idx])
    expected_t = torch.from_numpy(expected).permute(0, 3, 1, 2).float() / 255
    upright_shape = (16, 24) if rotation == 180 else (24, 16)
    assert expected_t.shape == (4, 3, *upright_shape)
    got = media.read_video(clip, num_frames=4, backend="av")
    record_parity("media-video-rotation", original="FFmpeg/FFmpeg@n6.1 fftools autorotate (transpose/hflip/vflip)",
                  how="package", actual=got, expected=expected_t, cases=(f"rotation {rotation}",))
    assert torch.equal(got, expected_t)
    # "auto" tries decord first: decord 0.6 cannot decode rotated clips, so PyAV does, upright
    assert torch.equal(media.read_video(clip, num_frames=4), expected_t)
    if HAS_DECORD:
        with pytest.raises(MediaError, match="rotation metadata, which decord"):
            media.read_video(clip, num_frames=4, backend="decord")
