"""The image bootstrap without detectron2: two models scored on the same resamples of their evaluation images (an
image drawn k times counts k times). COCO's per-image matching does not depend on the resample, so each model and task
is matched once (:func:`match_images`, saved by :func:`save_matches`) and each resample's AP, AP50 and AP75 is COCO's
accumulation with per-image multiplicities (area "all", 100 detections; equal to re-evaluating the resample to
~1e-15). docs/statistics.md#per-image-data-of-every-evaluation.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from dataclasses import dataclass
from typing import Dict, Mapping, Sequence, Union

import numpy as np

from ..utils.fileio import atomic_write, read_json

__all__ = [
    "AP_METRICS",
    "CocoMatches",
    "MATCHES_FORMAT",
    "coco_evaluator",
    "coco_ground_truth",
    "image_counts",
    "image_draws",
    "image_ids_digest",
    "load_matches",
    "match_images",
    "match_predictions",
    "resampled_ap",
    "resampled_mean",
    "save_matches",
]

IOU_TYPES = ("bbox", "segm")
AP_METRICS = ("AP", "AP50", "AP75")  # COCO names; AP50 / AP75 are the IoU-0.5 / 0.75 rows of AP

# Elements of the largest work array of one category ([resamples, detections], or [resamples, IoU
# thresholds, slots] for its equal scores): ~200 MB in float64.
_CHUNK_ELEMENTS = 25_000_000


def _quiet(*_args, **_kwargs):
    pass


def coco_ground_truth(dataset: dict):
    """faster-coco-eval's COCO object of a COCO annotation dict."""
    from faster_coco_eval import COCO  # imported when used: the report imports this module for its resampling

    return COCO(dataset, print_function=_quiet)


def coco_evaluator(coco_gt, predictions: Sequence[dict], iou_type: str):
    """faster-coco-eval's COCOeval of (copies of) ``predictions`` on ``coco_gt``, keeping the per-image results."""
    from faster_coco_eval import COCOeval_faster

    # For masks drop "bbox" so the instance area is the mask area, as detectron2's evaluator does.
    drop = "bbox" if iou_type == "segm" else None
    coco_dt = coco_gt.loadRes([{k: v for k, v in p.items() if k != drop} for p in predictions])
    return COCOeval_faster(coco_gt, coco_dt, iou_type, print_function=_quiet, separate_eval=True)


@dataclass
class CocoMatches:
    """One model's COCO matching on one evaluation set for one iou type. Detections (D) are ordered by category, then
    descending score, then image, then rank in the image (COCO's order); images are positions in
    ``dataset["images"]``, categories positions in the sorted category ids."""

    iou_type: str
    iou_thresholds: np.ndarray  # [T]
    recall_thresholds: np.ndarray  # [R], COCO's 101 points
    gt_count: np.ndarray  # [K, N] int: non-ignored ground truths per category and image
    category: np.ndarray  # [D] int
    image: np.ndarray  # [D] int
    score: np.ndarray  # [D] float
    tp: np.ndarray  # [T, D] bool: matched and not ignored
    fp: np.ndarray  # [T, D] bool: unmatched and not ignored
    group: np.ndarray  # [D] int: -1, or the id of its run of equal scores in its category (>= 2 detections)
    images_sha1: str = ""  # :func:`image_ids_digest` of the evaluation set (empty: unknown)

    @property
    def num_images(self) -> int:
        return self.gt_count.shape[1]


def image_ids_digest(dataset: Mapping) -> str:
    """SHA-1 (hex) of a COCO dataset's image ids in their order: equal digests = same evaluation images."""
    ids = np.asarray([int(im["id"]) for im in dataset.get("images", [])], dtype="<i8")
    return hashlib.sha1(ids.tobytes()).hexdigest()


def _per_image(ev, num_t: int):
    """(n, scores, matched [T, D], dt_ignore [T, D], gt_ignore) per non-empty evaluation, n in [K, A=1, I] order,
    from the pickled state of faster-coco-eval's private ``_evalImgs_cpp`` (as its own distributed merge reads it)."""
    from faster_coco_eval import __version__

    for n, e in enumerate(ev._evalImgs_cpp):
        state = e.__getstate__()
        known = isinstance(state, tuple) and len(state) == 6 and len(state[0]) == len(state[4]) == num_t * len(state[2])
        if not known:
            raise RuntimeError(
                f"faster-coco-eval {__version__}'s per-image results have an unknown layout; install "
                "the faster-coco-eval version range that condinit-det declares (setup.py)"
            )
        dt_m, _, scores, gt_ig, dt_ig, _ = state
        d = len(scores)
        if d == 0 and len(gt_ig) == 0:
            continue
        yield (
            n,
            scores,
            np.asarray(dt_m, dtype=np.int64).reshape(num_t, d) > 0,
            np.asarray(dt_ig, dtype=bool).reshape(num_t, d),
            np.asarray(gt_ig, dtype=bool),
        )


def match_images(dataset: Mapping, predictions: Sequence[dict], iou_type: str) -> CocoMatches:
    """Evaluate ``predictions`` once on a COCO annotation dict; see :class:`CocoMatches`."""
    copy = {
        **dataset,
        "images": [dict(im) for im in dataset.get("images", [])],
        # a match is a nonzero ground-truth id: fresh ids, as a resampled dataset has
        "annotations": [{**a, "id": n + 1} for n, a in enumerate(dataset.get("annotations", []))],
    }
    ev = coco_evaluator(coco_ground_truth(copy), list(predictions), iou_type)
    p = ev.params
    p.areaRng, p.areaRngLbl = [p.areaRng[0]], [p.areaRngLbl[0]]  # "all" only: AP, AP50, AP75
    with contextlib.redirect_stdout(io.StringIO()):
        ev.evaluate()
    p = ev.params  # evaluate() sorts image and category ids
    image_ids, cat_ids = [int(i) for i in p.imgIds], [int(c) for c in p.catIds]
    position = {int(im["id"]): n for n, im in enumerate(dataset["images"])}
    image_pos = np.array([position[i] for i in image_ids], dtype=np.int64)
    num_t, num_i = len(p.iouThrs), len(image_ids)

    gt_count = np.zeros((len(cat_ids), len(dataset["images"])), dtype=np.int64)
    # Each list starts empty of detections, so that an evaluation without any concatenates too.
    cat, img, rank = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    score, tp, fp = [np.zeros(0)], [np.zeros((num_t, 0), dtype=bool)], [np.zeros((num_t, 0), dtype=bool)]
    for n, scores, matched, dt_ig, gt_ig in _per_image(ev, num_t):
        k, i = divmod(n, num_i)  # evalImgs are [K, A=1, I]
        gt_count[k, image_pos[i]] = np.count_nonzero(~gt_ig)
        d = len(scores)
        cat.append(np.full(d, k))
        img.append(np.full(d, image_pos[i]))
        rank.append(np.arange(d))
        score.append(np.asarray(scores, dtype=np.float64))
        tp.append(matched & ~dt_ig)
        fp.append(~matched & ~dt_ig)
    cat, img, rank, score = (np.concatenate(a) for a in (cat, img, rank, score))
    tp, fp = np.concatenate(tp, axis=1), np.concatenate(fp, axis=1)
    order = np.lexsort((rank, img, -score, cat))
    cat, img, score, tp, fp = cat[order], img[order], score[order], tp[:, order], fp[:, order]
    same = (cat[1:] == cat[:-1]) & (score[1:] == score[:-1])
    tied = np.zeros(len(cat), dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    starts = tied & ~np.concatenate([[False], same])
    group = np.where(tied, np.cumsum(starts) - 1, -1)
    return CocoMatches(
        iou_type,
        np.asarray(p.iouThrs, dtype=np.float64),
        np.asarray(p.recThrs, dtype=np.float64),
        gt_count,
        cat,
        img,
        score,
        tp,
        fp,
        group,
        image_ids_digest(dataset),
    )


def match_predictions(
    ground_truth: Union[str, dict], predictions: Sequence[dict], iou_types: Sequence[str] = IOU_TYPES
) -> Dict[str, CocoMatches]:
    """:func:`match_images` for several iou types; a mask type is skipped when no prediction has a mask."""
    dataset = read_json(ground_truth) if not isinstance(ground_truth, Mapping) else ground_truth
    has_masks = all("segmentation" in p for p in predictions)
    return {t: match_images(dataset, predictions, t) for t in iou_types if t != "segm" or has_masks}


# Format of the saved matches (:func:`save_matches`); bumped when the layout changes.
MATCHES_FORMAT = 1


def _smallest_uint(a: np.ndarray) -> np.ndarray:
    return a.astype(np.min_scalar_type(int(a.max()) if a.size else 0))


def save_matches(path: str, matches: Mapping[str, CocoMatches]) -> int:
    """Save the matches of one evaluation (iou type -> :class:`CocoMatches`) compactly into one ``.npz``, atomically
    (float32 scores suffice: the stored order and ``group`` already record the order); returns the bytes written."""
    arrays = {"format": np.int64(MATCHES_FORMAT), "iou_types": np.asarray(sorted(matches), dtype=np.str_)}
    for t, m in matches.items():
        num_k = m.gt_count.shape[0]
        arrays.update(
            {
                f"{t}.iou_thresholds": m.iou_thresholds,
                f"{t}.recall_thresholds": m.recall_thresholds,
                f"{t}.gt_count": _smallest_uint(m.gt_count),
                f"{t}.per_category": np.bincount(m.category, minlength=num_k),
                f"{t}.image": _smallest_uint(m.image),
                f"{t}.score": m.score.astype(np.float32),
                f"{t}.tp": np.packbits(m.tp, axis=None),
                f"{t}.fp": np.packbits(m.fp, axis=None),
                f"{t}.group": m.group.astype(np.int32),
                f"{t}.images_sha1": np.str_(m.images_sha1),
            }
        )
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    data = buf.getvalue()
    atomic_write(path, data)
    return len(data)


def load_matches(path: str) -> Dict[str, CocoMatches]:
    """Read a file of :func:`save_matches`: iou type -> :class:`CocoMatches`. ValueError when it is not one."""
    try:
        with np.load(path, allow_pickle=False) as f:
            if int(f["format"]) != MATCHES_FORMAT:
                raise ValueError(f"format {int(f['format'])}, this version reads format {MATCHES_FORMAT}")
            out = {}
            for t in (str(v) for v in f["iou_types"]):
                per_category = f[f"{t}.per_category"].astype(np.int64)
                num_d, num_t = int(per_category.sum()), len(f[f"{t}.iou_thresholds"])
                bits = {
                    k: np.unpackbits(f[f"{t}.{k}"], count=num_t * num_d).reshape(num_t, num_d).astype(bool)
                    for k in ("tp", "fp")
                }
                out[t] = CocoMatches(
                    t,
                    f[f"{t}.iou_thresholds"].astype(np.float64),
                    f[f"{t}.recall_thresholds"].astype(np.float64),
                    f[f"{t}.gt_count"].astype(np.int64),
                    np.repeat(np.arange(per_category.size), per_category),
                    f[f"{t}.image"].astype(np.int64),
                    f[f"{t}.score"].astype(np.float64),
                    bits["tp"],
                    bits["fp"],
                    f[f"{t}.group"].astype(np.int64),
                    str(f[f"{t}.images_sha1"]),
                )
            return out
    except (OSError, KeyError, ValueError, EOFError) as e:
        raise ValueError(f"{path} is not a file of saved COCO matches ({e})") from None


def _first_reaching(npig: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """[Rc, R] smallest true-positive count m with m / npig >= threshold, in float64 as COCO's recall."""
    n = np.maximum(npig, 1).astype(np.float64)[:, None]
    m = np.ceil(thresholds[None] * n)
    m = np.where((m >= 1) & ((m - 1) / n >= thresholds), m - 1, m)
    m = np.where(m / n < thresholds, m + 1, m)
    return m.astype(np.int64)


class _Ties:
    """Detections of equal score in one category: their order depends on the draw order."""

    def __init__(self, m: CocoMatches):
        tied = np.flatnonzero(m.group >= 0)
        self.num_groups = int(m.group.max()) + 1 if tied.size else 0
        # per image, its tied detections by group, then rank (their order within the matches)
        self.dets = tied[np.lexsort((tied, m.group[tied], m.image[tied]))]
        self.per_image = np.bincount(m.image[tied], minlength=m.num_images)
        self.start = np.concatenate([[0], np.cumsum(self.per_image)[:-1]])

    def expand(self, m: CocoMatches, draws: np.ndarray):
        """Every resample's tied detections, one entry per drawn copy, in COCO's order inside a group: (group,
        resample, det, position in its (group, resample) run, slots per group = longest run over the resamples)."""
        rc = draws.shape[0]
        per_draw = self.per_image[draws].ravel()
        total = int(per_draw.sum())
        run_start = np.cumsum(per_draw) - per_draw
        within = np.arange(total) - np.repeat(run_start, per_draw)
        det = self.dets[np.repeat(self.start[draws].ravel(), per_draw) + within]
        res = np.repeat(np.repeat(np.arange(rc), draws.shape[1]), per_draw)
        g = m.group[det]
        order = np.argsort(g * rc + res, kind="stable")
        g, res, det = g[order], res[order], det[order]
        key = g * rc + res
        new_run = np.diff(key, prepend=-1) != 0  # keys are >= 0: the first entry starts a run
        pos = np.arange(total) - np.maximum.accumulate(np.where(new_run, np.arange(total), 0))
        slots = np.zeros(self.num_groups, dtype=np.int64)
        np.maximum.at(slots, g, pos + 1)
        return g, res, det, pos, slots


def _interpolated_sum(tps: np.ndarray, fps: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """[rows] sum over the recall thresholds of COCO's interpolated precision, from cumulative true / false positive
    counts [rows, P] at the points of a precision-recall curve (any subset that holds every point where a true positive
    was added) and ``reach`` [rows, R], the true-positive count each threshold needs (0 where none reaches it)."""
    rows, s = tps.shape
    if s == 0:
        return np.zeros(rows)
    pr = tps / (fps + tps + np.spacing(1))
    envelope = np.maximum.accumulate(pr[:, ::-1], axis=1)[:, ::-1]
    # first point whose recall reaches each threshold: one searchsorted over all rows at once,
    # rows kept apart by an integer offset larger than any count
    big = int(tps[:, -1].max()) + 2
    offset = np.arange(rows, dtype=np.int64)[:, None] * big
    keys = (tps + offset).ravel()
    first = np.searchsorted(keys, (np.minimum(reach, big - 1) + offset).ravel(), side="left").reshape(reach.shape)
    inside = first - np.arange(rows)[:, None] * s < s
    return np.where(inside, envelope.ravel()[np.minimum(first, keys.size - 1)], 0.0).sum(axis=1)


def _cumsum0(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Cumulative sums along ``axis`` with a leading 0: entry i is the sum of the first i values."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (1, 0)
    return np.pad(np.cumsum(x, axis=axis, dtype=np.int32), pad)


class _Category:
    """One category's detections in COCO's order, as points of its precision-recall curve.

    Untied detections keep one order in every resample, weighted by their image's multiplicity; a group of equal
    scores becomes, per resample, a run of unit slots holding the drawn copies in COCO's order (empty slots repeat the
    previous point). Only points where a true positive can be added matter: per IoU threshold, the untied true
    positives and every group slot; false positives so far = non-ignored weight so far - true positives so far.
    """

    def __init__(self, m: CocoMatches, lo: int, hi: int):
        group = m.group[lo:hi]
        starts = (group < 0) | np.concatenate([[True], group[1:] != group[:-1]])
        unit = np.cumsum(starts) - 1  # position of each detection's unit (detection or group) in the order
        untied = np.flatnonzero(group < 0)
        first = np.flatnonzero(starts & (group >= 0))
        self.image = m.image[lo:hi][untied]
        self.unit = unit[untied]
        self.groups, self.group_unit = group[first], unit[first]
        tp, counted = m.tp[:, lo:hi][:, untied], (m.tp[:, lo:hi] | m.fp[:, lo:hi])[:, untied]
        self.tp = [np.flatnonzero(row) for row in tp]  # positions among the untied detections
        self.ignored = [np.flatnonzero(~row) for row in counted]

    def _group_slots(self, m: CocoMatches, rc: int, expanded):
        """(unit of each slot [S], cumulative true positives / non-ignored [Rc, T, S + 1]) of the groups."""
        if not self.groups.size:
            no_slot = np.zeros((rc, m.tp.shape[0], 1), dtype=np.int32)  # the cumulative counts of no slot
            return np.zeros(0, dtype=np.int64), no_slot, no_slot
        g, res, det, pos, slots = expanded
        per_group = slots[self.groups]
        base = np.cumsum(per_group) - per_group
        slot_of_group = np.zeros(self.groups.max() - self.groups.min() + 1, dtype=np.int64)
        slot_of_group[self.groups - self.groups.min()] = base
        a, b = np.searchsorted(g, self.groups.min()), np.searchsorted(g, self.groups.max() + 1)
        slot = slot_of_group[g[a:b] - self.groups.min()] + pos[a:b]
        tp = np.zeros((rc, m.tp.shape[0], int(per_group.sum())), dtype=np.int32)
        counted = np.zeros_like(tp)
        tp[res[a:b], :, slot] = m.tp[:, det[a:b]].T
        counted[res[a:b], :, slot] = (m.tp[:, det[a:b]] | m.fp[:, det[a:b]]).T
        return np.repeat(self.group_unit, per_group), _cumsum0(tp), _cumsum0(counted)

    def sums(self, m: CocoMatches, counts: np.ndarray, reach: np.ndarray, expanded) -> np.ndarray:
        """[Rc, T] precision sums over the recall thresholds, for the multiplicities ``counts`` [Rc, N]."""
        rc = counts.shape[0]
        w = counts[:, self.image]
        weight = _cumsum0(w)
        slot_unit, slot_tp, slot_counted = self._group_slots(m, rc, expanded)
        out = np.empty((rc, len(self.tp)))
        for t, (pos, ign) in enumerate(zip(self.tp, self.ignored)):
            # points: the untied true positives, then the group slots, merged by their unit
            unit = np.concatenate([self.unit[pos], slot_unit])
            order = np.argsort(unit, kind="stable")
            unit, is_slot = unit[order], order >= pos.size
            # untied true positives / untied detections / group slots up to and including each point
            n_tp = np.searchsorted(self.unit[pos], unit, side="right")
            n_det = np.searchsorted(self.unit, unit, side="right")
            n_slot = np.where(is_slot, order - pos.size + 1, np.searchsorted(slot_unit, unit))
            tps = _cumsum0(w[:, pos])[:, n_tp]
            counted = weight[:, n_det] - _cumsum0(w[:, ign])[:, np.searchsorted(ign, n_det)]
            tps = tps + slot_tp[:, t, n_slot]
            counted = counted + slot_counted[:, t, n_slot]
            out[:, t] = _interpolated_sum(tps, counted - tps, reach)
        return out


def resampled_ap(matches: CocoMatches, draws: np.ndarray) -> Dict[str, np.ndarray]:
    """COCO AP, AP50 and AP75 (percent, [B] each; NaN without any non-ignored ground truth) on each resample of the
    images: row b of ``draws`` [B, n] holds the image positions of resample b in draw order."""
    m = matches
    draws = np.asarray(draws, dtype=np.int64)
    counts = image_counts(draws, m.num_images).astype(np.int32)
    num_b, num_k = draws.shape[0], m.gt_count.shape[0]
    nt, nr = len(m.iou_thresholds), len(m.recall_thresholds)
    npig = counts @ m.gt_count.T  # [B, K]
    bounds = np.searchsorted(m.category, np.arange(num_k + 1))
    ties = _Ties(m) if (m.group >= 0).any() else None
    categories = [_Category(m, lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
    # work arrays per category: [Rc, detections] and [Rc, T, ~2 x its tied detections]
    widest = max(
        (int(hi - lo + 2 * nt * (m.group[lo:hi] >= 0).sum()) for lo, hi in zip(bounds[:-1], bounds[1:])), default=1
    )
    chunk = max(1, _CHUNK_ELEMENTS // max(widest, 1))
    sums = np.zeros((num_b, nt, num_k))
    for r0 in range(0, num_b, chunk):
        rows = slice(r0, min(r0 + chunk, num_b))
        expanded = ties.expand(m, draws[rows]) if ties is not None else None
        for k in range(num_k):
            if bounds[k + 1] == bounds[k] or not npig[rows, k].any():
                continue  # no detection: precision 0; no ground truth: left out
            reach = _first_reaching(npig[rows, k], m.recall_thresholds)
            sums[rows, :, k] = categories[k].sums(m, counts[rows], reach, expanded)
    valid = npig > 0
    num_valid = valid.sum(axis=1)
    per_t = np.where(valid[:, None, :], sums, 0.0).sum(axis=2)  # [B, T]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {"AP": 100.0 * per_t.sum(axis=1) / (num_valid * nt * nr)}
        for name, iou in (("AP50", 0.5), ("AP75", 0.75)):
            t = int(np.flatnonzero(np.isclose(m.iou_thresholds, iou))[0])
            out[name] = 100.0 * per_t[:, t] / (num_valid * nr)
    return out


def image_draws(rng: np.random.Generator, num_images: int, num_resamples: int) -> np.ndarray:
    """[num_resamples, num_images] image positions drawn with replacement: resample b is the b-th
    ``rng.integers(0, num_images, size=num_images)``."""
    if num_images <= 0:
        raise ValueError(f"there are no evaluation images to resample (num_images={num_images})")
    return rng.integers(0, num_images, size=(int(num_resamples), int(num_images)))


def image_counts(draws: np.ndarray, num_images: int) -> np.ndarray:
    """[..., B, N] how often each image position is drawn in each resample of ``draws`` [..., B, n]."""
    draws = np.asarray(draws, dtype=np.int64)
    rows = draws.reshape(-1, draws.shape[-1])
    offsets = np.arange(rows.shape[0], dtype=np.int64)[:, None] * num_images
    counts = np.bincount((rows + offsets).ravel(), minlength=rows.shape[0] * num_images)
    return counts.reshape(draws.shape[:-1] + (num_images,))


def resampled_mean(values: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """[..., B] mean of per-image values on each resample of the images.

    Args:
        values: [..., N] one value per evaluation image (e.g. 100 x top-1 correctness).
        draws: [..., B, n] image positions in [0, N) per resample; leading dimensions broadcast with those of
            ``values`` (e.g. values [S, seeds, N] with draws [S, 1, B, n]).
    """
    values = np.asarray(values, dtype=np.float64)
    counts = image_counts(draws, values.shape[-1]).astype(np.float64)
    return np.matmul(counts, values[..., None])[..., 0] / np.shape(draws)[-1]
