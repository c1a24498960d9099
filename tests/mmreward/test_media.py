"""Media I/O: every accepted input form, the value-range rules, and video decoding and sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mmreward import media
from mmreward.errors import MediaError, RewardInputError


def _rgb(h=5, w=7, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_path_pil_numpy_tensor_agree(tmp_path):
    arr = _rgb()
    Image.fromarray(arr).save(tmp_path / "x.png")
    expected = torch.from_numpy(arr).permute(2, 0, 1).float() / 255
    for item in (tmp_path / "x.png", str(tmp_path / "x.png"), Image.fromarray(arr), arr,
                 torch.from_numpy(arr).permute(2, 0, 1).contiguous()):
        torch.testing.assert_close(media.load_image(item), expected, atol=0, rtol=0)


def test_float_inputs_need_declared_range():
    arr = _rgb().astype(np.float32)
    with pytest.raises(MediaError, match=r"value_range=\(0, 255\)"):
        media.load_image(arr)  # 0-255 floats are not silently rescaled
    out = media.load_image(arr, value_range=(0, 255))
    torch.testing.assert_close(out, torch.from_numpy(arr).permute(2, 0, 1) / 255)
    signed = torch.rand(3, 4, 4) * 2 - 1
    torch.testing.assert_close(media.load_image(signed, value_range=(-1, 1)), (signed + 1) / 2)
    with pytest.raises(MediaError, match=r"value_range=\(-1, 1\)"):
        media.load_image(signed)
    with pytest.raises(MediaError, match="NaN"):
        media.load_image(torch.full((3, 2, 2), float("nan")))
    with pytest.raises(MediaError, match="uint8 data is always 0-255"):
        media.load_image(torch.zeros(3, 2, 2, dtype=torch.uint8), value_range=(0, 1))


def test_rgba_grayscale_palette_and_16bit():
    rgba = np.zeros((2, 2, 4), dtype=np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = 0  # fully transparent red
    dropped = media.load_image(Image.fromarray(rgba, "RGBA"))
    torch.testing.assert_close(dropped[0], torch.full((2, 2), 200 / 255))  # PIL convert("RGB") semantics
    white = media.load_image(Image.fromarray(rgba, "RGBA"), alpha="white")
    torch.testing.assert_close(white, torch.ones(3, 2, 2))
    gray = media.load_image(Image.fromarray(np.full((3, 3), 51, np.uint8), "L"))
    torch.testing.assert_close(gray, torch.full((3, 3, 3), 0.2))
    pal = Image.fromarray(_rgb(4, 4)).convert("P", palette=Image.Palette.ADAPTIVE, colors=4)
    ref = np.asarray(pal.convert("RGB"), dtype=np.float32) / 255
    torch.testing.assert_close(media.load_image(pal), torch.from_numpy(ref).permute(2, 0, 1))
    i16 = Image.fromarray(np.full((2, 2), 65535, np.uint16))
    torch.testing.assert_close(media.load_image(i16), torch.ones(3, 2, 2))
    torch.testing.assert_close(media.load_image(np.full((2, 2), 65535, np.uint16)), torch.ones(3, 2, 2))


def test_bad_layouts_and_files(tmp_path):
    with pytest.raises(MediaError, match="channel-last"):
        media.load_image(torch.rand(8, 8, 3))
    with pytest.raises(MediaError, match="1, 3 or 4 channels"):
        media.load_image(torch.rand(5, 8, 8))
    with pytest.raises(MediaError, match="not found"):
        media.load_image(tmp_path / "missing.png")
    bad = tmp_path / "corrupt.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nthis is not a png")
    with pytest.raises(MediaError, match="corrupt"):
        media.load_image(bad)
    with pytest.raises(MediaError, match="PIL.Image, numpy array or torch tensor"):
        media.load_image(42)
    with pytest.raises(MediaError, match=r"\(B, C, H, W\)"):
        media.to_batch(torch.rand(2, 2))
    with pytest.raises(MediaError, match=r"media\[1\]"):
        media.to_batch([torch.rand(3, 2, 2), tmp_path / "missing.png"])


def test_batches_stack_or_stay_lists():
    same = media.to_batch([torch.rand(3, 4, 4), np.zeros((4, 4, 3), np.uint8)])
    assert isinstance(same, torch.Tensor) and same.shape == (2, 3, 4, 4)
    mixed = media.to_batch([torch.rand(3, 4, 4), torch.rand(3, 5, 6)])
    assert isinstance(mixed, list) and [t.shape for t in mixed] == [(3, 4, 4), (3, 5, 6)]
    video = media.to_batch(torch.rand(2, 3, 3, 4, 4), modality="video")
    assert video.shape == (2, 3, 3, 4, 4)
    x = torch.rand(2, 3, 4, 4, requires_grad=True)
    assert media.requires_grad(media.to_batch(x))  # the graph is kept for differentiable rewards


def test_frame_sampling_rules():
    assert media.sample_frame_indices(10, 4) == [0, 3, 6, 9]
    assert media.sample_frame_indices(10, 5, sampling="center") == [1, 3, 5, 7, 9]
    assert media.sample_frame_indices(30, fps=10, source_fps=30) == list(range(0, 30, 3))
    assert media.sample_frame_indices(5) == [0, 1, 2, 3, 4]
    with pytest.raises(RewardInputError, match="either num_frames or fps"):
        media.sample_frame_indices(10, 2, fps=1, source_fps=10)
    with pytest.raises(MediaError, match="no frames"):
        media.sample_frame_indices(0, 2)


def _write_video(path, n=12, size=32, fps=12):
    """Frame i is a flat grey of level 20 * i, so decoded frames identify themselves."""
    import av

    codec = {".mp4": "mpeg4", ".avi": "mpeg4", ".webm": "libvpx", ".gif": "gif"}[path.suffix]
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "rgb8" if codec == "gif" else "yuv420p"
        if codec != "gif":
            stream.bit_rate = 2_000_000
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(np.full((size, size, 3), 20 * i, np.uint8), format="rgb24")
            for pkt in stream.encode(frame):
                out.mux(pkt)
        for pkt in stream.encode():
            out.mux(pkt)


@pytest.mark.parametrize("suffix", [".mp4", ".webm", ".avi", ".gif"])
def test_video_decoding_and_sampling(tmp_path, suffix):
    pytest.importorskip("av")
    path = tmp_path / f"v{suffix}"
    try:
        _write_video(path)
    except Exception as exc:  # noqa: BLE001 - an encoder missing from this PyAV build
        pytest.skip(f"cannot encode {suffix} here: {exc}")
    video = media.read_video(path, num_frames=4, backend="av")
    assert video.shape == (4, 3, 32, 32)
    levels = (video.mean(dim=(1, 2, 3)) * 255 / 20).round().tolist()
    assert levels == [0, 4, 7, 11]  # linspace(0, 11, 4) rounded
    capped = media.read_video(path, num_frames=2, max_pixels=16 * 16, backend="av")
    assert capped.shape == (2, 3, 16, 16)
    batch = media.to_batch([path, path], modality="video", num_frames=3)
    assert batch.shape == (2, 3, 3, 32, 32)
    torch.testing.assert_close(media.read_video(path, num_frames=4), video, atol=2 / 255, rtol=0)  # auto backend
    if "decord" in media.available_video_backends():
        if suffix == ".gif":  # decord cannot read GIFs: an explicit request says so, "auto" uses PyAV
            with pytest.raises(MediaError, match="decord"):
                media.read_video(path, num_frames=4, backend="decord")
        else:  # same frames from both decoders
            torch.testing.assert_close(media.read_video(path, num_frames=4, backend="decord"), video, atol=2 / 255, rtol=0)


def test_corrupt_and_missing_video(tmp_path):
    pytest.importorskip("av")
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video at all")
    with pytest.raises(MediaError, match="cannot decode video"):
        media.read_video(bad, num_frames=2, backend="av")
    with pytest.raises(MediaError, match="not found"):
        media.read_video(tmp_path / "none.mp4")
    if "decord" not in media.available_video_backends():
        with pytest.raises(MediaError, match="'decord' is not installed"):
            media.read_video(bad, backend="decord")


def test_alpha_keep_returns_rgba_only_for_transparent_images():
    rgba = np.full((4, 5, 4), 200, np.uint8)
    opaque = rgba.copy()
    opaque[..., 3] = 255
    rgba[0, 0, 3] = 0
    kept = media.load_image(Image.fromarray(rgba), alpha="keep")
    assert kept.shape == (4, 4, 5) and float(kept[3, 0, 0]) == 0.0
    assert media.load_image(Image.fromarray(opaque), alpha="keep").shape == (3, 4, 5)
    la = Image.fromarray(rgba).convert("LA")
    assert media.load_image(la, alpha="keep").shape == (4, 4, 5)
    batch = media.to_batch([Image.fromarray(rgba), Image.fromarray(opaque)], alpha="keep")
    assert [t.shape[0] for t in batch] == [4, 3]  # a list: channel counts differ
    t = torch.from_numpy(rgba).permute(2, 0, 1)[None]
    assert media.to_batch(t, alpha="keep").shape == (1, 4, 4, 5)
    assert media.to_batch(t).shape == (1, 3, 4, 5)
    with pytest.raises(RewardInputError, match="alpha must be"):
        media.load_image(Image.fromarray(rgba), alpha="transparent")


def test_alpha_keep_rgba_keeps_alpha_only_for_pil_mode_rgba(tmp_path):
    """alpha="keep_rgba" (qwen_vl_utils' to_rgb): only PIL mode "RGBA" keeps alpha; LA, PA, RGBa and P with a
    transparent index come out as Pillow's own convert("RGB") makes them (the expected values), from PIL images
    and PNG files; 4-channel arrays and tensors, which have no mode, are RGBA."""
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (6, 7, 4), dtype=np.uint8)
    rgba[0, 0, 3] = 0
    rgba_im = Image.fromarray(rgba)
    la = rgba_im.convert("LA")
    pal = Image.fromarray(rng.integers(0, 4, (6, 7), dtype=np.uint8)).convert("P")
    pal.putpalette(rng.integers(0, 256, 12, dtype=np.uint8).tobytes())
    pal.info["transparency"] = 1

    def pil_rgb(im):
        return torch.from_numpy(np.asarray(im.convert("RGB")).copy()).permute(2, 0, 1).float() / 255

    kept = media.load_image(rgba_im, alpha="keep_rgba")
    assert torch.equal(kept, torch.from_numpy(rgba).permute(2, 0, 1).float() / 255)
    for im in (la, pal, pal.convert("PA"), rgba_im.convert("RGBa")):
        assert torch.equal(media.load_image(im, alpha="keep_rgba"), pil_rgb(im)), im.mode
        assert media.load_image(im, alpha="keep").shape == (4, 6, 7), im.mode  # "keep" still counts them as RGBA
    for name, im in (("la.png", la), ("p.png", pal)):
        im.save(tmp_path / name)
        with Image.open(tmp_path / name) as f:
            assert f.mode == im.mode and ("transparency" in f.info) == (im.mode == "P")
            expected = pil_rgb(f)
        assert torch.equal(media.to_batch([tmp_path / name], alpha="keep_rgba"), expected[None]), name
    t = torch.from_numpy(rgba).permute(2, 0, 1)[None]
    assert media.to_batch(t, alpha="keep_rgba").shape == (1, 4, 6, 7)
    assert media.load_image(rgba, alpha="keep_rgba").shape == (4, 6, 7)


# ----------------------------------------------------------------------------------------------
# input validation: sizes, dtypes, value ranges, decompression bombs, symlinks
# ----------------------------------------------------------------------------------------------
def png_header_only(path, width, height):
    """A tiny PNG whose header claims width x height pixels (no pixel data is ever allocated to write it)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("item", [
    np.zeros((0, 0, 3), np.uint8), np.zeros((0, 5, 3), np.uint8), np.zeros((4, 0), np.uint8),
    torch.zeros(3, 0, 4), torch.zeros(3, 4, 0), Image.new("RGB", (0, 0)),
], ids=["np0x0", "np0x5", "np4x0gray", "t0x4", "t4x0", "pil0x0"])
def test_zero_size_images_are_media_errors(item):
    with pytest.raises(MediaError, match="0 pixels"):
        media.load_image(item)
    with pytest.raises(MediaError, match="0 pixels"):
        media.to_batch([item])


@pytest.mark.parametrize("batch,modality", [
    (torch.zeros(2, 3, 0, 0), "image"), (np.zeros((2, 0, 4, 3), np.uint8), "image"),
    (torch.zeros(1, 2, 3, 0, 4), "video"), (torch.zeros(1, 0, 3, 4, 4), "video"),
    ([np.zeros((0, 4, 4, 3), np.uint8)], "video"), ([torch.zeros(2, 3, 4, 0)], "video"),
])
def test_zero_size_batches_and_videos_are_media_errors(batch, modality):
    with pytest.raises(MediaError, match="0 pixels|0 frames"):
        media.to_batch(batch, modality=modality)


@pytest.mark.parametrize("arr", [
    np.array([[1, 2], [3, 4]], dtype=object),
    np.empty((4, 4, 3), dtype=object),
    np.empty((2, 4, 4, 3), dtype=object),
], ids=["obj2d", "obj3d", "obj4d"])
def test_numpy_object_arrays_are_media_errors(arr):
    with pytest.raises(MediaError, match="dtype object"):
        media.load_image(arr) if arr.ndim < 4 else media.to_batch(arr)


@pytest.mark.parametrize("value_range", [
    255, (0,), (0, 1, 2), (1, 0), (0, 0), (0, float("nan")), (float("-inf"), 1), (0, float("inf")), "ab", ("0", "1"),
])
def test_bad_value_range_is_a_typed_error(value_range):
    for call in (lambda: media.load_image(torch.rand(3, 2, 2), value_range=value_range),
                 lambda: media.to_batch(torch.rand(1, 3, 2, 2), value_range=value_range),
                 lambda: media.load_video(torch.rand(2, 3, 2, 2), value_range=value_range)):
        with pytest.raises(RewardInputError, match="value_range"):
            call()


def test_value_range_accepts_any_pair_of_numbers():
    x = torch.rand(3, 2, 2) * 255
    ref = x / 255
    for vr in ((0, 255), [0, 255], np.array([0.0, 255.0]), (np.float32(0), np.int64(255))):
        torch.testing.assert_close(media.load_image(x, value_range=vr), ref)
    u8 = torch.zeros(3, 2, 2, dtype=torch.uint8)
    torch.testing.assert_close(media.load_image(u8, value_range=[0, 255]), torch.zeros(3, 2, 2))


def test_decompression_bomb_is_a_media_error(tmp_path):
    bomb = png_header_only(tmp_path / "bomb.png", 20000, 20000)
    assert bomb.stat().st_size < 100
    with pytest.raises(MediaError, match="400000000 pixels"):
        media.read_image(bomb)
    with pytest.raises(MediaError, match=r"media\[0\].*400000000 pixels"):
        media.to_batch([bomb])


def test_images_above_max_pixels_are_rejected_before_decoding(tmp_path, monkeypatch):
    from PIL import ImageFile

    big = png_header_only(tmp_path / "big.png", 9000, 9000)  # under PIL's own bomb limit, above ours

    def no_decode(self):
        raise AssertionError("the image was decoded before the size check")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decode)
    with pytest.raises(MediaError, match=rf"9000x9000.*max_image_pixels={media.MAX_IMAGE_PIXELS}"):
        media.read_image(big)
    monkeypatch.undo()
    small = tmp_path / "small.png"
    Image.fromarray(_rgb(10, 20)).save(small)
    with pytest.raises(MediaError, match="max_image_pixels=100"):
        media.load_image(small, max_image_pixels=100)
    with pytest.raises(MediaError, match="max_image_pixels=100"):
        media.to_batch([small, small], max_image_pixels=100)
    with pytest.raises(MediaError, match="max_image_pixels=100"):
        media.load_image(Image.open(small), max_image_pixels=100)
    assert media.load_image(small, max_image_pixels=200).shape == (3, 10, 20)  # the cap is inclusive
    assert media.to_batch([small], max_image_pixels=None).shape == (1, 3, 10, 20)


def test_broken_and_looping_symlinks_are_yielded_and_fail_clearly(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    Image.fromarray(_rgb()).save(d / "ok.png")
    (d / "dangling.png").symlink_to(d / "gone.png")
    (d / "loop_a.png").symlink_to(d / "loop_b.png")
    (d / "loop_b.png").symlink_to(d / "loop_a.png")
    (d / "notes.txt").symlink_to(d / "nothing.txt")  # not media: skipped as before
    found = sorted(p.name for p in media.iter_media_files([d]))
    assert found == ["dangling.png", "loop_a.png", "loop_b.png", "ok.png"]
    for name in ("dangling.png", "loop_a.png"):
        with pytest.raises(MediaError, match="symbolic link"):
            media.load_image(d / name)
    with pytest.raises(MediaError, match="symbolic link"):
        media.read_video(d / "dangling.png")
