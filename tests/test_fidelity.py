"""Object fidelity: the locator, fit on real frames with twin labels, finds an object where it is drawn, and only there."""
import numpy as np
import pytest

from comsim.io.lerobot import LeRobotDataset, write_dataset
from comsim.episode import Episode, Provenance
from comsim.io.labels import labels_from_palette, seg_to_rgb
from comsim.metrics.fidelity import LocatorConfig, evaluate_object_fidelity, fit_fidelity_model, fit_locator, object_fidelity


def scene(T=12, size=32, shift=0, cube=True, seed=0):
    """Frames of a grey noisy table, a white robot bar sweeping right and a 3x3 red cube moving down;
    labels say where the cube is, the frames draw it ``shift`` px to the right of that."""
    rng = np.random.default_rng(seed)
    frames = (rng.normal(110, 6, (T, size, size, 3))).clip(0, 255).astype(np.uint8)
    labels = np.zeros((T, size, size), np.int32)
    for t in range(T):
        x0 = 2 + t
        labels[t, 2:8, x0:x0 + 10] = 1
        frames[t, 2:8, x0:x0 + 10] = (235, 235, 240)
        cy, cx = 14 + t // 2, 16
        labels[t, cy:cy + 3, cx:cx + 3] = 2
        if cube:
            frames[t, cy:cy + 3, cx + shift:cx + shift + 3] = (200, 30, 35)
    return frames, labels


TINY = LocatorConfig(width=8, depth=2, steps=150, batch=8)


def test_objects_within_2px_where_drawn_missed_where_moved_or_gone():
    frames, labels = scene()
    model = fit_locator(frames, labels, TINY)
    assert model.object_labels == [2]
    same = object_fidelity(*scene(seed=1), model)
    assert same["object_within"] == 1.0 and same["object_error_px_median"] < 0.5
    assert same["robot_iou"] > 0.95
    moved = object_fidelity(*scene(seed=1, shift=4), model)  # partly inside the +-3 px search window at 32 px
    assert moved["object_within"] == 0.0 and 2.5 < moved["object_error_px_median"] < 4.5
    far = object_fidelity(*scene(seed=1, shift=9), model)  # outside it: a miss, not a far-away match
    assert far["object_within"] == 0.0 and far["objects"][2]["missed"] == len(labels)
    gone = object_fidelity(*scene(seed=1, cube=False), model)
    assert gone["object_within"] == 0.0 and gone["objects"][2]["missed"] == len(labels)


def test_fidelity_of_datasets_from_their_own_twin_labels(tmp_path):
    """Datasets on disk: labels ride as the <cam>_sim_seg palette video (H.264), read back to labels."""
    def write(path, **kw):
        frames, labels = scene(**kw)
        ep = Episode(frames={"front": frames, "front_sim": frames, "front_sim_seg": seg_to_rgb(labels)},
                     action=np.zeros((len(frames), 8), np.float32), state=np.zeros((len(frames), 8), np.float32),
                     fps=10, provenance=Provenance(source="lab", task="push", seed=0))
        return write_dataset(path, [ep], fps=10)

    paired = write(tmp_path / "paired")
    back = labels_from_palette(LeRobotDataset(paired).read_episode(0).frames["front_sim_seg"])
    assert (back == scene()[1]).mean() > 0.97  # lossy video: a few edge pixels of the 3x3 cube may change
    model = fit_fidelity_model(paired, "front", config=TINY)
    good = evaluate_object_fidelity(write(tmp_path / "good", seed=3), model, "front")
    bad = evaluate_object_fidelity(write(tmp_path / "bad", seed=3, shift=5), model, "front")
    assert good["object_within"] > 0.9 and bad["object_within"] < 0.1
    assert list(good["objects"]) == [2] and good["objects"][2]["frames"] == good["object_frames"]
    assert bad["objects"][2]["within"] == bad["object_within"]
    with pytest.raises(ValueError, match="front_sim_seg.*--controls seg"):
        evaluate_object_fidelity(paired, model, "side")


def test_label_video_decodes_without_phantom_objects_at_cube_edges(tmp_path):
    """H.264 blends a red cube's edge with the black background into a brown nearest to label 9, and the
    robot's edge into a grey: decoded, the labels are the ones drawn, and the cube keeps its edge pixels."""
    T, size = 6, 128
    labels = np.zeros((T, size, size), np.int32)
    for t in range(T):
        labels[t, 10:40, 20 + 3 * t:30 + 3 * t] = 1  # the arm
        labels[t, 79 + t:84 + t, 57:62] = 2  # a 5-px red cube, on odd and even rows
        labels[t, 60:65, 90 + t:95 + t] = 3  # a blue one
    ep = Episode(frames={"front": seg_to_rgb(labels).astype(np.uint8), "front_sim_seg": seg_to_rgb(labels).astype(np.uint8)},
                 action=np.zeros((T, 8), np.float32), state=np.zeros((T, 8), np.float32), fps=10,
                 provenance=Provenance(source="lab", task="push", seed=0))
    back = labels_from_palette(LeRobotDataset(write_dataset(tmp_path / "d", [ep], fps=10)).read_episode(0)
                               .frames["front_sim_seg"])
    assert set(np.unique(back)) == {0, 1, 2, 3}
    for lab in (2, 3):
        inter = ((back == lab) & (labels == lab)).sum((1, 2))
        union = ((back == lab) | (labels == lab)).sum((1, 2))
        assert (inter / union).min() > 0.7, lab
        for t in range(T):
            drawn = np.argwhere(labels[t] == lab).mean(0)
            assert np.abs(np.argwhere(back[t] == lab).mean(0) - drawn).max() < 0.5, (lab, t)


def test_locator_fit_is_seeded_and_leaves_the_callers_rng_alone():
    import torch

    frames, labels = scene()
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = fit_locator(frames, labels, TINY)
    assert torch.rand(1) == before  # the locator's init used its own seed, not the global stream
    b = fit_locator(frames, labels, TINY)
    np.testing.assert_array_equal(a.probability(frames), b.probability(frames))
    c = fit_locator(frames, labels, LocatorConfig(**{**TINY.__dict__, "seed": 1}))
    assert not np.array_equal(a.probability(frames), c.probability(frames))


@pytest.mark.parametrize("field,value", [("width", 0), ("depth", 2.5), ("steps", -1), ("lr", 0.0)])
def test_bad_locator_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"LocatorConfig.{field}"):
        LocatorConfig(**{field: value})


def test_locator_fit_does_not_depend_on_the_callers_thread_count():
    """A stage that runs after `comsim convert` (1 thread) and the same stage resumed alone (the machine's
    default) fit the same locator: it runs with its own LocatorConfig.threads and gives the count back."""
    import torch

    frames, labels = scene()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = fit_locator(frames, labels, TINY).probability(frames)
        torch.set_num_threads(2)
        b = fit_locator(frames, labels, TINY).probability(frames)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    np.testing.assert_array_equal(a, b)
