"""Light copies of robot meshes: decimated visuals and exact convex hulls, cached on disk.

Why: the Panda meshes have 134k faces and llvmpipe draws them at ~60 frames/s at
128x128. A twin renders many frames, so `visual: light` swaps in decimated copies.

Decimation is adaptive (octree) vertex clustering in dependency-free numpy: each
cluster's vertex sits at the minimum of its face-plane quadrics (Lindstrom 2000), and a
cell is split until that point is within ``tol`` of every face plane around it. Flat
sides and sharp edges stay where they are; silhouettes move by about ``tol``. Vertices
are split per texture colour (the Panda uses a flat-colour atlas) so colours never bleed,
and normals are re-smoothed up to a crease angle, since the originals are flat-shaded.

Collisions are unchanged: MuJoCo collides a mesh as its convex hull, so the collision
geom gets the exact hull of the ORIGINAL vertices and physics is the same in both modes.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CACHE_VERSION = "2"  # bump when the decimation changes: cached files are rebuilt


def cache_dir() -> Path:
    """``$COMSIM_CACHE/meshes`` or ``~/.cache/comsim/meshes``."""
    root = os.environ.get("COMSIM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "comsim")
    return Path(root) / "meshes"


@dataclass
class ObjMesh:
    vertices: np.ndarray  # (V, 3) float
    faces: np.ndarray  # (F, 3) int, 0-based
    texcoords: np.ndarray | None = None  # (T, 2) float
    face_texcoords: np.ndarray | None = None  # (F, 3) int into texcoords
    normals: np.ndarray | None = None  # (N, 3) float
    face_normals: np.ndarray | None = None  # (F, 3) int into normals


def read_obj(path: str | Path) -> ObjMesh:
    """Triangle OBJ reader: v, vt, vn and f (v, v/vt, v/vt/vn, v//vn); polygons are split."""
    verts, uvs, normals, faces, face_uvs, face_normals = [], [], [], [], [], []
    for line in Path(path).read_text().splitlines():
        if line.startswith("v "):
            verts.append(line.split()[1:4])
        elif line.startswith("vt "):
            uvs.append(line.split()[1:3])
        elif line.startswith("vn "):
            normals.append(line.split()[1:4])
        elif line.startswith("f "):
            corners = [c.split("/") for c in line.split()[1:]]
            vi = [int(c[0]) for c in corners]
            ti = [int(c[1]) if len(c) > 1 and c[1] else 0 for c in corners]
            ni = [int(c[2]) if len(c) > 2 and c[2] else 0 for c in corners]
            for k in range(1, len(corners) - 1):  # fan-triangulate polygons
                faces.append((vi[0], vi[k], vi[k + 1]))
                face_uvs.append((ti[0], ti[k], ti[k + 1]))
                face_normals.append((ni[0], ni[k], ni[k + 1]))
    v = np.asarray(verts, dtype=np.float64)
    mesh = ObjMesh(v, _index(faces, len(v)))
    if uvs and np.all(np.asarray(face_uvs) != 0):
        mesh.texcoords = np.asarray(uvs, dtype=np.float64)
        mesh.face_texcoords = _index(face_uvs, len(uvs))
    if normals and np.all(np.asarray(face_normals) != 0):
        mesh.normals = np.asarray(normals, dtype=np.float64)
        mesh.face_normals = _index(face_normals, len(normals))
    return mesh


def _index(obj_indices: list, count: int) -> np.ndarray:
    """OBJ indices are 1-based and negatives count back from the end."""
    i = np.asarray(obj_indices, dtype=np.int64)
    return np.where(i < 0, i + count, i - 1)


def write_obj(path: Path, mesh: ObjMesh) -> None:
    """Write atomically (temporary name, then rename): parallel builders may race."""
    lines = [f"v {x:.6f} {y:.6f} {z:.6f}" for x, y, z in mesh.vertices]
    corners = [mesh.faces + 1]
    if mesh.texcoords is not None:
        lines += [f"vt {u:.6f} {w:.6f}" for u, w in mesh.texcoords]
        corners.append(mesh.face_texcoords + 1)
    if mesh.normals is not None:
        lines += [f"vn {x:.5f} {y:.5f} {z:.5f}" for x, y, z in mesh.normals]
        if mesh.texcoords is None:
            corners.append(np.zeros_like(mesh.faces))  # "v//vn"
        corners.append(mesh.face_normals + 1)
    idx = np.stack(corners, axis=2)  # (F, 3 corners, fields)
    for face in idx:
        lines.append("f " + " ".join("/".join(str(i) if i else "" for i in c) for c in face))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; a shared cache should be readable
    os.replace(tmp, path)


def _face_colour_classes(mesh: ObjMesh, texture: np.ndarray | None) -> np.ndarray:
    """(F,) class id per face: the texel colour under the face's mean UV (0 if untextured)."""
    if texture is None or mesh.texcoords is None:
        return np.zeros(len(mesh.faces), dtype=np.int64)
    h, w = texture.shape[:2]
    uv = mesh.texcoords[mesh.face_texcoords].mean(axis=1) % 1.0
    # The v direction does not matter: the class only has to be consistent, and the
    # representative UV of a class is taken from one of its own faces.
    px = texture[np.clip((uv[:, 1] * h).astype(int), 0, h - 1), np.clip((uv[:, 0] * w).astype(int), 0, w - 1)]
    _, cls = np.unique(px.reshape(len(px), -1), axis=0, return_inverse=True)
    return cls.reshape(-1)


def _face_planes(vertices: np.ndarray, faces: np.ndarray):
    p0, p1, p2 = (vertices[faces[:, k]] for k in range(3))
    cross = np.cross(p1 - p0, p2 - p0)
    area2 = np.linalg.norm(cross, axis=1)
    n = cross / np.maximum(area2, 1e-30)[:, None]
    d = -np.einsum("ij,ij->i", n, p0)
    return n, d, area2


def cluster_vertices(vertices: np.ndarray, faces: np.ndarray, tol: float,
                     max_cell: float = 0.032, min_cell: float = 0.001) -> tuple[np.ndarray, np.ndarray]:
    """Adaptive (octree) vertex clustering; returns (cluster position, cluster id per vertex).

    A cell is kept when the quadric-optimal point of its vertices lies within ``tol`` of
    every face plane that touches it; otherwise it is split in eight, down to ``min_cell``.
    Flat and gently curved regions end up in big cells, details in small ones.
    """
    n, d, area2 = _face_planes(vertices, faces)
    # Per-vertex sums of area-weighted plane quadrics: minimise sum w (n.x + d)^2.
    A_face = area2[:, None, None] * n[:, :, None] * n[:, None, :]
    b_face = area2[:, None] * n * d[:, None]
    A_v = np.zeros((len(vertices), 3, 3))
    b_v = np.zeros((len(vertices), 3))
    for k in range(3):
        np.add.at(A_v, faces[:, k], A_face)
        np.add.at(b_v, faces[:, k], b_face)

    origin = vertices.min(axis=0) - 1e-6
    cluster_of = np.full(len(vertices), -1, dtype=np.int64)
    positions: list[np.ndarray] = []
    active = np.zeros(len(vertices), dtype=bool)
    active[np.unique(faces)] = True
    cell = max_cell
    while active.any():
        idx = np.flatnonzero(active)
        keys = np.floor((vertices[idx] - origin) / cell).astype(np.int64)
        _, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        ncl = inv.max() + 1
        A = np.zeros((ncl, 3, 3))
        b = np.zeros((ncl, 3))
        mean = np.zeros((ncl, 3))
        np.add.at(A, inv, A_v[idx])
        np.add.at(b, inv, b_v[idx])
        np.add.at(mean, inv, vertices[idx])
        mean /= np.bincount(inv, minlength=ncl)[:, None]
        # Regularise towards the mean so flat or thin clusters stay well posed.
        lam = 1e-4 * np.trace(A, axis1=1, axis2=2)[:, None] / 3 + 1e-15
        x = np.linalg.solve(A + lam[:, :, None] * np.eye(3), (lam * mean - b)[:, :, None])[:, :, 0]
        outside = np.abs(x - mean).max(axis=1) > cell  # a far minimum is a numerical accident
        x[outside] = mean[outside]
        # Error: the largest distance from a cluster's point to a plane of a face touching it.
        local = np.full(len(vertices), -1, dtype=np.int64)
        local[idx] = inv
        err = np.zeros(ncl)
        for k in range(3):
            c = local[faces[:, k]]
            ok = c >= 0
            dist = np.abs(np.einsum("ij,ij->i", n[ok], x[c[ok]]) + d[ok])
            np.maximum.at(err, c[ok], dist)
        done = (err <= tol) | (cell / 2 < min_cell)
        done_v = done[inv]
        # Renumber the kept clusters densely.
        kept = np.flatnonzero(done)
        renum = np.full(ncl, -1, dtype=np.int64)
        renum[kept] = np.arange(len(kept))
        base = sum(len(p) for p in positions)
        cluster_of[idx[done_v]] = renum[inv[done_v]] + base
        positions.append(x[kept])
        active[idx[done_v]] = False
        cell /= 2
    return np.concatenate(positions), cluster_of


def decimate(mesh: ObjMesh, tol: float, texture: np.ndarray | None = None) -> ObjMesh:
    """Simplify ``mesh`` to about ``tol`` metres of surface error, keeping texture colours.

    Geometry is clustered once for all faces (no cracks between colour regions); each
    output vertex is a (cluster, colour class) pair whose UV points into that colour.
    """
    classes = _face_colour_classes(mesh, texture)
    n_classes = int(classes.max()) + 1
    points, cluster_of = cluster_vertices(mesh.vertices, mesh.faces, tol)
    faces = cluster_of[mesh.faces]
    # Drop faces that collapsed, then duplicates (same corners, same colour).
    keep = (faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2]) & (faces[:, 0] != faces[:, 2])
    src = np.flatnonzero(keep)
    _, first = np.unique(np.concatenate([np.sort(faces[src], axis=1), classes[src, None]], axis=1),
                         axis=0, return_index=True)
    src = src[np.sort(first)]  # index of each kept face in the original mesh
    faces, face_class = faces[src], classes[src]
    pair, corner = np.unique((faces * n_classes + face_class[:, None]).reshape(-1), return_inverse=True)
    out = ObjMesh(points[pair // n_classes], corner.reshape(-1, 3))
    if mesh.texcoords is not None:
        # Any UV of a class's own faces points into that class's colour.
        class_uv = np.zeros((n_classes, 2))
        class_uv[classes] = mesh.texcoords[mesh.face_texcoords].mean(axis=1)
        out.texcoords = class_uv
        out.face_texcoords = np.repeat(face_class[:, None], 3, axis=1)
    # Clustering folds a few thin faces over; turn them back the way their source faced
    # (keeping them keeps the silhouette).
    n_out, _, _ = _face_planes(out.vertices, out.faces)
    n_src, _, _ = _face_planes(mesh.vertices, mesh.faces[src])
    folded = np.einsum("ij,ij->i", n_out, n_src) < 0
    out.faces[folded] = out.faces[folded][:, [0, 2, 1]]
    if out.face_texcoords is not None:
        out.face_texcoords[folded] = out.face_texcoords[folded][:, [0, 2, 1]]
    out.normals, out.face_normals = smooth_normals(out.vertices, out.faces)
    return out


def smooth_normals(vertices: np.ndarray, faces: np.ndarray, crease_deg: float = 40.0,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per-corner normals, smoothed over neighbouring faces within ``crease_deg`` ("auto smooth").

    The original Panda meshes are flat-shaded but so dense that they look smooth; their
    decimated copies need smoothing to look the same, except across real creases.
    Returns (normals (N, 3), face_normals (F, 3) indices).
    """
    n, _, area2 = _face_planes(vertices, faces)
    corner_face = np.repeat(np.arange(len(faces)), 3)
    corner_vert = faces.reshape(-1)
    order = np.argsort(corner_vert, kind="stable")
    cv, cf = corner_vert[order], corner_face[order]
    start = np.searchsorted(cv, cv, side="left")
    count = np.bincount(cv, minlength=len(vertices))[cv]
    # All (corner, neighbour face) pairs around each vertex.
    rep = np.repeat(np.arange(len(cv)), count)
    nb = cf[start[rep] + (np.arange(len(rep)) - np.repeat(np.cumsum(count) - count, count))]
    mine = cf[rep]
    ok = np.einsum("ij,ij->i", n[mine], n[nb]) >= np.cos(np.radians(crease_deg))
    acc = np.zeros((len(cv), 3))
    np.add.at(acc, rep[ok], area2[nb[ok], None] * n[nb[ok]])
    acc /= np.maximum(np.linalg.norm(acc, axis=1), 1e-12)[:, None]
    corner_normals = np.empty_like(acc)
    corner_normals[order] = acc
    normals, inv = np.unique(np.round(corner_normals, 4), axis=0, return_inverse=True)
    return normals, inv.reshape(-1, 3)


def convex_hull(vertices: np.ndarray) -> ObjMesh:
    """Closed, outward-oriented hull of ``vertices`` (what MuJoCo collides anyway)."""
    from scipy.spatial import ConvexHull

    hull = ConvexHull(vertices)
    idx = np.unique(hull.simplices)
    remap = np.full(len(vertices), -1, dtype=np.int64)
    remap[idx] = np.arange(len(idx))
    faces = hull.simplices.copy()
    p = vertices[faces]
    normal = np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
    flip = np.einsum("ij,ij->i", normal, hull.equations[:, :3]) < 0
    faces[flip] = faces[flip][:, [0, 2, 1]]
    return ObjMesh(vertices[idx], remap[faces])


def _texture_pixels(path: str | Path | None) -> np.ndarray | None:
    if path is None or not Path(path).is_file():
        return None
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB"))


def light_mesh_files(obj_path: str | Path, tol: float, texture_path: str | Path | None = None,
                     ) -> tuple[Path, Path]:
    """Cached (decimated visual OBJ, convex hull OBJ) for ``obj_path``; built once."""
    obj_path = Path(obj_path)
    h = hashlib.sha256(obj_path.read_bytes())
    h.update(f"{CACHE_VERSION}:{tol:.6g}".encode())
    if texture_path is not None and Path(texture_path).is_file():
        h.update(Path(texture_path).read_bytes())
    stem = f"{obj_path.stem}-{h.hexdigest()[:12]}"
    visual, hull = cache_dir() / f"{stem}-light.obj", cache_dir() / f"{stem}-hull.obj"
    if not (visual.is_file() and hull.is_file()):
        mesh = read_obj(obj_path)
        write_obj(visual, decimate(mesh, tol, _texture_pixels(texture_path)))
        write_obj(hull, convex_hull(mesh.vertices))
    return visual, hull
