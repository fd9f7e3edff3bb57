"""CompositionalVideoDiT: a video diffusion transformer with two droppable conditions.

One self-contained file. The model predicts the flow-matching velocity ``v = noise - x0``
(``prediction_type="velocity"``) or the clean latents x0 (``"sample"``, as in JiT: Li & He 2025,
"Back to Basics: Let Denoising Generative Models Denoise"; in pixel space the clean frame is the
low-dimensional target while the noise is not, and the loss stays on the velocity) of a latent
video from

- the noisy latents ``(B, C, T, H, W)`` and the timestep ``(B,)`` (sigma * 1000),
- the ACTION trajectory ``(B, T_pix, A)`` (normalized): every latent frame's tokens are
  modulated (AdaLN-Zero) by the embedding of that frame's own action(s), so frame t is
  tied to action t and nothing else,
- the SIM video latents ``(B, Cs, T, H, W)``: concatenated on channels with a presence
  mask channel (1 = sim given). Extra control channels (seg, depth) simply ride along in Cs.

Each condition can be dropped per sample (``action_keep`` / ``sim_keep`` False): a
dropped action is replaced by a learned null embedding, a dropped sim video by zeros,
mask 0 and a learned null bias on the tokens. Training drops them independently so the
sampler can compose the unconditional, action-only and sim-only predictions.

Tokens: patches of (pt, ph, pw) latent voxels, full spatio-temporal self-attention with
3D rotary position embeddings (time, height, width each own a slice of every head), plus a
fixed absolute 2D sin-cos embedding of each token's (row, column): rotary embeddings are
relative only, and without the sim video the model must still know WHERE in the frame a
token is to draw the arm where the action puts it.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.attention import FeedForward
from diffusers.models.attention_processor import Attention
from diffusers.models.embeddings import TimestepEmbedding, Timesteps, apply_rotary_emb, get_1d_rotary_pos_embed
from diffusers.models.modeling_utils import ModelMixin
from einops import rearrange

from comsim.io.labels import SEG_DECODE_TOLERANCE, SEG_PALETTE


PREDICTION_TYPES = ("velocity", "sample")
BACKDROP_SOURCES = ("colour", "labels")


def twin_object_labels(seg: torch.Tensor) -> torch.Tensor:
    """(N, L, ...) bool: the pixels of a label video ``(N, 3, ...)`` in [-1, 1] that show object label 2 + l (its
    palette colour within SEG_DECODE_TOLERANCE); L = the palette's object labels."""
    palette = torch.as_tensor(SEG_PALETTE[2:], dtype=torch.float32, device=seg.device) / 127.5 - 1.0
    # |s - p|^2 = |s|^2 - 2 s.p + |p|^2: one (3 x L) product per pixel instead of an L-fold broadcast of the video
    seg = seg.float()
    dist = ((seg.square().sum(1, keepdim=True) + palette.square().sum(1).view(1, -1, *([1] * (seg.dim() - 2))))
            - 2.0 * torch.einsum("nc...,lc->nl...", seg, palette))
    return dist <= (SEG_DECODE_TOLERANCE / 127.5) ** 2
# x-prediction turns into a velocity by dividing by sigma; JiT clips sigma there so that the
# nearly clean end of the path does not blow the loss (and the last Euler steps) up.
MIN_SIGMA_FOR_SAMPLE = 0.05


def velocity_from_output(output, noisy_latents, sigma, prediction_type: str):
    """The flow velocity ``noise - x0`` that a model ``output`` stands for at noise level ``sigma`` (B,).

    ``velocity``: the output is the velocity. ``sample``: it is x0, and with
    ``x_t = (1 - sigma) x0 + sigma noise`` the velocity is ``(x_t - x0) / sigma``. Linear in the
    output for a fixed (x_t, sigma), so guidance may compose outputs before converting them.
    """
    if prediction_type == "velocity":
        return output
    if prediction_type != "sample":
        raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")
    s = sigma.to(output.dtype).clamp_min(MIN_SIGMA_FOR_SAMPLE).view(-1, *([1] * (output.dim() - 1)))
    return (noisy_latents - output) / s


def action_frames_for(latent_frames: int, actions_per_latent_frame: int, causal_first_frame: bool) -> int:
    """Number of pixel-rate actions that ``latent_frames`` latent frames stand for."""
    k = actions_per_latent_frame
    return 1 + (latent_frames - 1) * k if causal_first_frame else latent_frames * k


def rope_3d(grid: tuple[int, int, int], head_dim: int, theta: float = 10000.0, device=None):
    """cos, sin of shape (T*H*W, head_dim) for a (T, H, W) token grid; time gets the remainder."""
    d_hw = 2 * (head_dim // 6)
    d_t = head_dim - 2 * d_hw
    T, H, W = grid
    parts = []
    for d, n in ((d_t, T), (d_hw, H), (d_hw, W)):
        parts.append(get_1d_rotary_pos_embed(d, torch.arange(n, dtype=torch.float32), theta, use_real=True))
    (ct, st), (ch, sh), (cw, sw) = parts

    def grid3(a, b, c):  # (T,dt) (H,dh) (W,dw) -> (T*H*W, dt+dh+dw)
        a = a[:, None, None].expand(T, H, W, -1)
        b = b[None, :, None].expand(T, H, W, -1)
        c = c[None, None, :].expand(T, H, W, -1)
        return torch.cat([a, b, c], dim=-1).reshape(T * H * W, -1)

    return grid3(ct, ch, cw).to(device), grid3(st, sh, sw).to(device)


def sincos_2d(height: int, width: int, dim: int, device=None) -> torch.Tensor:
    """Fixed absolute (row, column) embedding (H*W, dim): half the channels each, sin|cos pairs."""
    quarter = dim // 4
    freqs = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float32) / quarter)
    rows = torch.arange(height, dtype=torch.float32)[:, None] * freqs  # (H, dim/4)
    cols = torch.arange(width, dtype=torch.float32)[:, None] * freqs
    r = torch.cat([rows.sin(), rows.cos()], dim=-1)[:, None].expand(height, width, -1)
    c = torch.cat([cols.sin(), cols.cos()], dim=-1)[None, :].expand(height, width, -1)
    emb = torch.cat([r, c], dim=-1).reshape(height * width, -1)
    return F.pad(emb, (0, dim - emb.shape[1])).to(device)


class RoPEAttnProcessor:
    """Self-attention with rotary embeddings on q and k (diffusers ``Attention`` processor)."""

    def __call__(self, attn: Attention, hidden_states, encoder_hidden_states=None, attention_mask=None, rope=None):
        B, N, _ = hidden_states.shape
        q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        q, k, v = (x.view(B, N, attn.heads, -1).transpose(1, 2) for x in (q, k, v))
        if attn.norm_q is not None:
            q, k = attn.norm_q(q), attn.norm_k(k)
        if rope is not None:
            q, k = apply_rotary_emb(q, rope), apply_rotary_emb(k, rope)
        out = F.scaled_dot_product_attention(q, k, v)
        out = out.transpose(1, 2).reshape(B, N, -1).to(q.dtype)
        return attn.to_out[1](attn.to_out[0](out))


class DiTBlock(nn.Module):
    """Pre-norm attention + MLP, both AdaLN-Zero modulated by a per-token-time condition."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(dim, heads=heads, dim_head=dim // heads, qk_norm="rms_norm", eps=1e-6,
                              bias=True, processor=RoPEAttnProcessor())
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(dim, mult=mlp_ratio, activation_fn="gelu-approximate")
        self.ada = nn.Linear(dim, 6 * dim)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, x, cond, rope, tokens_per_time: int):
        # x (B, Tt*S, D); cond (B, Tt, D): each token-time row modulates its own S spatial tokens.
        B, N, D = x.shape
        mod = self.ada(F.silu(cond)).repeat_interleave(tokens_per_time, dim=1)  # (B, N, 6D)
        shift1, scale1, gate1, shift2, scale2, gate2 = mod.chunk(6, dim=-1)
        h = self.norm1(x) * (1 + scale1) + shift1
        x = x + gate1 * self.attn(h, rope=rope)
        h = self.norm2(x) * (1 + scale2) + shift2
        return x + gate2 * self.ff(h)


class CompositionalVideoDiT(ModelMixin, ConfigMixin):
    """Video DiT conditioned on per-frame actions (AdaLN) and a sim video (channel concat).

    Args:
        in_channels: latent channels C of the video being generated (3 for the pixel codec).
        sim_channels: channels Cs of the sim condition (sim latents + optional control channels).
        action_dim: A, the action vector size (8 for the Panda: 7 joints + gripper).
        num_frames, sample_size: the latent window (T, (H, W)) the model is trained on.
        patch_size: (pt, ph, pw) latent voxels per token.
        dim, depth, heads, mlp_ratio: transformer size.
        actions_per_latent_frame: pixel frames per latent frame (a video VAE's temporal factor).
        causal_first_frame: the first latent frame stands for ONE pixel frame (Wan-style 1+4k).
        abs_pos_embed: add the absolute 2D sin-cos embedding to the tokens (see the module doc).
        action_fourier: each normalized action value a also enters as sin/cos(2^k * pi/2 * a),
            k < action_fourier: joint angles act on the image through sines and cosines.
        prediction_type: what ``forward`` returns, ``velocity`` or ``sample`` (x0); see
            ``velocity_from_output``.
        sim_residual: with ``sample``, the x0 prediction of a sample whose sim video is given is
            the sim latents plus the network's output: the twin already draws the scene where it
            is, so the network starts at the raw sim render and learns only what the real camera
            adds. A sample without sim predicts x0 outright (from the plate, with ``background_plate``).
        background_plate: with ``sim_residual``, where the sim render shows the static background
            (within ``plate_tolerance`` of the twin's background plate, summed over latent channels)
            the residual starts from the REAL background plate instead: the camera and the cell do not
            move, so the real table's grain, the wall and the lighting are one fixed image, fit once
            on the training pairs (``fit_background_plate``). Patches of 16x16 px cannot draw that
            texture; a full-resolution plate does. The arm, the objects and anything the plate
            does not cover keep the sim render as their start. A sample without sim starts from the
            plate everywhere, so the guided branches share the same background texture and the guidance
            does not amplify it.
        plate_follows_camera: with ``background_plate`` (pixel latents): the real plate is moved, frame by frame,
            by the camera's image shift (``camera_shift``, px, as the twin's replay measured and rendered it) minus
            the mean shift of the frames it was fit on: a camera bumped or drifting by a pixel moves the wall and
            the table with it, and the twin's render already follows it. No shift given (a factory episode,
            rendered at the calibrated camera): shift 0.
        plate_tolerance: how far (latent units, summed over channels) a sim pixel may be from the twin's
            plate and still count as background: 0.38 is 48 of 255 grey levels in pixel space.
        patch_bottleneck: > 0: the patch embedding goes through this many values first (JiT's
            bottleneck for large pixel patches, e.g. 16x16 at 128x128).
        paste_twin_objects: with ``sim_residual`` and pixel latents whose sim condition carries the twin's
            label video at channel ``seg_channel``: on the pixels the labels give to an object (label >= 2), a
            sample with sim is the twin's render there, recoloured by one affine colour map per label fit on
            the training pairs (``fit_object_colours``). A 5-px cube is what a policy learns from, and the
            twin knows exactly where it is; learned, its edge blurs over the replay's 1-2 px misalignment.
    """

    _supports_gradient_checkpointing = True

    @register_to_config
    def __init__(
        self,
        in_channels: int = 3,
        sim_channels: int = 3,
        action_dim: int = 8,
        num_frames: int = 8,
        sample_size: tuple[int, int] = (32, 32),
        patch_size: tuple[int, int, int] = (1, 4, 4),
        dim: int = 128,
        depth: int = 4,
        heads: int = 4,
        mlp_ratio: float = 4.0,
        actions_per_latent_frame: int = 1,
        causal_first_frame: bool = False,
        rope_theta: float = 10000.0,
        abs_pos_embed: bool = True,
        action_fourier: int = 4,
        prediction_type: str = "velocity",
        sim_residual: bool = False,
        patch_bottleneck: int = 0,
        background_plate: bool = False,
        plate_tolerance: float = 0.38,
        paste_twin_objects: bool = False,
        seg_channel: int = -1,
        backdrop_from: str = "colour",
        pixel_head: int = 0,
        head_cells: int = 4,
        plate_follows_camera: bool = False,
    ):
        super().__init__()
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")
        if sim_residual and (prediction_type != "sample" or sim_channels < in_channels):
            raise ValueError("sim_residual needs prediction_type='sample' and sim latents in the first "
                             f"in_channels={in_channels} sim channels (got {prediction_type!r}, {sim_channels})")
        if background_plate and not sim_residual:
            raise ValueError("background_plate needs sim_residual=True: the plate replaces the sim render as the "
                             "residual's start where the sim shows the background")
        pt, ph, pw = patch_size
        if dim % heads or (dim // heads) % 2 or dim // heads < 8:
            raise ValueError(f"dim={dim} must split into {heads} heads of an even size >= 8")
        if num_frames % pt or sample_size[0] % ph or sample_size[1] % pw:
            raise ValueError(f"num_frames x sample_size = {num_frames} x {tuple(sample_size)} must be divisible "
                             f"by patch_size={tuple(patch_size)}")
        self.gradient_checkpointing = False
        if patch_bottleneck < 0:
            raise ValueError(f"patch_bottleneck must be >= 0 (0 = off), got {patch_bottleneck}")
        if backdrop_from not in BACKDROP_SOURCES:
            raise ValueError(f"backdrop_from must be one of {BACKDROP_SOURCES}, got {backdrop_from!r}")
        if background_plate and backdrop_from == "labels" and not (in_channels == 3
                                                                  and in_channels <= seg_channel <= sim_channels - 3):
            raise ValueError(f"backdrop_from='labels' needs pixel latents (in_channels=3, got "
                             f"{in_channels}) and the label video's 3 channels in the sim condition (seg_channel="
                             f"{seg_channel} of {sim_channels} sim channels)")
        if pixel_head < 0 or (pixel_head and (head_cells < 1 or ph % head_cells or pw % head_cells)):
            raise ValueError(f"pixel_head={pixel_head} (channels, 0 = off) needs head_cells={head_cells} to divide the "
                             f"patch's height and width {(ph, pw)}")
        if pixel_head and not sim_residual:
            raise ValueError("pixel_head replaces the per-token output with a gain and an offset on the residual's "
                             "start: it needs sim_residual=True")
        if plate_follows_camera and not (background_plate and in_channels == 3):
            raise ValueError(f"plate_follows_camera moves the real background plate in pixels: it needs background_plate=True "
                             f"and pixel latents (in_channels=3, got {in_channels})")
        if paste_twin_objects and not (sim_residual and in_channels == 3 and in_channels <= seg_channel <= sim_channels - 3):
            raise ValueError(f"paste_twin_objects needs sim_residual=True, pixel latents (in_channels=3, got {in_channels}) "
                             f"and the label video's 3 channels in the sim condition (seg_channel={seg_channel} of "
                             f"{sim_channels} sim channels)")
        patch_in = (in_channels + sim_channels + 1) * pt * ph * pw  # +1: sim presence mask
        # JiT's bottleneck patch embedding: a large pixel patch is projected to a few values first
        self.patch_embed = (nn.Sequential(nn.Linear(patch_in, patch_bottleneck), nn.Linear(patch_bottleneck, dim))
                            if patch_bottleneck else nn.Linear(patch_in, dim))
        self.sim_null = nn.Parameter(torch.zeros(dim))  # added to tokens whose sim was dropped

        self.time_proj = Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.time_embed = TimestepEmbedding(256, dim)
        # one token-time covers pt latent frames = pt * k pixel-rate actions (causal: padded in front)
        self.actions_per_token = pt * actions_per_latent_frame
        features = self.actions_per_token * action_dim * (1 + 2 * action_fourier)
        self.action_embed = TimestepEmbedding(features, dim)  # Linear-SiLU-Linear
        self.action_null = nn.Parameter(torch.randn(dim) * 0.02)

        self.blocks = nn.ModuleList([DiTBlock(dim, heads, mlp_ratio) for _ in range(depth)])
        self.norm_out = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Linear(dim, 2 * dim)
        self.proj_out = None if pixel_head else nn.Linear(dim, in_channels * pt * ph * pw)
        for lin in (self.ada_out, self.proj_out):
            if lin is not None:
                nn.init.zeros_(lin.weight)
                nn.init.zeros_(lin.bias)
        self.head_proj = self.head = None
        if pixel_head:
            # A full-resolution head instead of painting each token's 16x16 pixels on its own: the tokens give
            # pixel_head features per cell of a grid head_cells times finer than the patches, upsampled
            # bilinearly to every pixel (so no pixel is drawn by one token alone and no token edge shows), then
            # per-pixel convolutions mix them with the twin's full-resolution features (the residual's start, the
            # render, its labels and normals) into a gain and an offset on the start: edges and texture come from
            # the twin, light and colour from the tokens. Zero-initialised last layer: starts as the start itself.
            self.head_proj = nn.Linear(dim, pixel_head * pt * head_cells * head_cells)
            c_in = pixel_head + in_channels + sim_channels + 1
            # per-pixel layers only: a head that sees its neighbours learned to blur the arm's edge (a hedge
            # between where the twin and the real camera put it), so the edge is the twin's, moved by nothing
            hidden = 2 * pixel_head
            self.head = nn.Sequential(nn.Conv2d(c_in, hidden, 1), nn.SiLU(), nn.Conv2d(hidden, 2 * in_channels, 1))
            nn.init.zeros_(self.head[-1].weight)
            nn.init.zeros_(self.head[-1].bias)
        if background_plate:
            # (C, H, W) latents, saved with the weights; zeros until fit_background_plate
            self.register_buffer("plate_sim", torch.zeros(in_channels, *sample_size))
            self.register_buffer("plate_real", torch.zeros(in_channels, *sample_size))
        if plate_follows_camera:
            # (x, y) px: the mean camera shift of the frames the plate was fit on (where plate_real sits)
            self.register_buffer("plate_shift_px", torch.zeros(2))
        if paste_twin_objects:
            # (labels, C, C + 1): real = A[:, :C] @ sim + A[:, C] per object label; identity until fit_object_colours
            identity = torch.cat([torch.eye(in_channels), torch.zeros(in_channels, 1)], dim=1)
            self.register_buffer("object_colour", identity.repeat(len(SEG_PALETTE) - 2, 1, 1))
        self._rope_cache: dict = {}

    @torch.no_grad()
    def fit_background_plate(self, real_latents: torch.Tensor, sim_latents: torch.Tensor,
                             camera_shift: torch.Tensor | None = None) -> float:
        """Set the two plates from training frames ``(N, C, H, W)``: the twin's is the per-pixel median of
        the sim frames (the arm covers any pixel in fewer than half of them); the real one the per-pixel
        median of the real frames where the sim frame shows that background. A pixel the arm always
        covers keeps the twin's plate, so there the residual starts from the sim render as without a
        plate. With ``plate_follows_camera``, ``camera_shift`` (N, 2) px is each frame's camera shift: the plate
        then sits at their mean. Returns the fraction of (frame, pixel) pairs counted as background."""
        if not self.config.background_plate:
            raise ValueError("fit_background_plate: this model has background_plate=False")
        C, H, W = self.plate_sim.shape
        if real_latents.shape[1:] != (C, H, W) or sim_latents.shape[0] != real_latents.shape[0] \
                or sim_latents.shape[1] < C or sim_latents.shape[2:] != (H, W):
            raise ValueError(f"fit_background_plate: real latents (N, {C}, {H}, {W}) and their sim condition "
                             f"(N, >= {C}, {H}, {W}) expected, got {tuple(real_latents.shape)} and "
                             f"{tuple(sim_latents.shape)}")
        real, sim = real_latents.float().cpu(), sim_latents.float().cpu()
        plate_sim = sim[:, :C].median(dim=0).values
        self.plate_sim.copy_(plate_sim)
        background = self.shows_backdrop(sim)  # (N, 1, H, W)
        plate_real = real.masked_fill(~background, float("nan")).nanmedian(dim=0).values
        plate_real = torch.where(plate_real.isnan(), plate_sim, plate_real)
        self.plate_real.copy_(plate_real)
        if self.config.plate_follows_camera:
            shift = torch.zeros(len(real), 2) if camera_shift is None else camera_shift.float().cpu().reshape(len(real), 2)
            self.plate_shift_px.copy_(shift.mean(0))
        return float(background.float().mean())

    @torch.no_grad()
    def fit_object_colours(self, real_latents: torch.Tensor, sim_latents: torch.Tensor, min_pixels: int = 50) -> dict:
        """Fit each object label's affine colour map, least squares from the twin's render to the real frame, on
        training frames ``(N, C, H, W)`` and their full sim condition ``(N, Cs, H, W)``, over the label's pixels
        shrunk by one pixel (the replay's misalignment and H.264 blend the edge). A label with fewer than
        ``min_pixels`` keeps the identity. Returns {label: pixels fit on}."""
        if not self.config.paste_twin_objects:
            raise ValueError("fit_object_colours: this model has paste_twin_objects=False")
        C = self.config.in_channels
        real, sim = real_latents.float().cpu(), sim_latents.float().cpu()
        s = self.config.seg_channel
        labels = twin_object_labels(sim[:, s:s + 3])  # (N, L, H, W)
        inner = ~F.max_pool2d((~labels).float(), 3, stride=1, padding=1).bool()
        counts = {}
        for i in range(labels.shape[1]):
            m = inner[:, i]
            counts[i + 2] = int(m.sum())
            if counts[i + 2] < min_pixels:
                continue
            x = torch.cat([sim[:, :C].permute(0, 2, 3, 1)[m], torch.ones(counts[i + 2], 1)], dim=1)  # (n, C + 1)
            y = real.permute(0, 2, 3, 1)[m]  # (n, C)
            self.object_colour[i].copy_(torch.linalg.lstsq(x.double(), y.double()).solution.T.float())
        return counts

    def _paste_twin_objects(self, x, sim_latents, sim_keep):
        """x (B, C, T, H, W) with each object label's pixels replaced by its colour map of the twin's render,
        in the samples whose sim is kept."""
        C = self.config.in_channels
        s = self.config.seg_channel
        labels = twin_object_labels(sim_latents[:, s:s + 3]) & sim_keep.view(-1, 1, 1, 1, 1)  # (B, L, T, H, W)
        render = sim_latents[:, :C].to(x.dtype)
        A = self.object_colour.to(x.dtype)
        for i in range(labels.shape[1]):
            if labels[:, i].any():
                recoloured = torch.einsum("ij,bjthw->bithw", A[i, :, :C], render) + A[i, :, C].view(1, C, 1, 1, 1)
                x = torch.where(labels[:, i:i + 1], recoloured, x)
        return x

    def shows_backdrop(self, sim_latents: torch.Tensor) -> torch.Tensor:
        """True where the twin shows its backdrop, dim 1 kept: ``sim_latents`` (N, Cs, ...) is the sim condition
        (render first, then its controls). ``backdrop_from="labels"``: the twin's label video says background
        (label 0, its palette colour within SEG_DECODE_TOLERANCE), so a robot pixel the colour of the wall is still
        robot; ``"colour"``: the render is within ``plate_tolerance`` of the twin's plate."""
        if self.config.backdrop_from == "labels":
            s = self.config.seg_channel
            black = torch.full((1, 3, *([1] * (sim_latents.dim() - 2))), -1.0, device=sim_latents.device)
            return ((sim_latents[:, s:s + 3].float() - black).square().sum(1, keepdim=True)
                    <= (SEG_DECODE_TOLERANCE / 127.5) ** 2)
        sim_latents = sim_latents[:, :self.config.in_channels]
        plate_sim = self.plate_sim.to(sim_latents).view(1, -1, *([1] * (sim_latents.dim() - 4)), *self.plate_sim.shape[1:])
        return (sim_latents - plate_sim).abs().sum(1, keepdim=True) < self.config.plate_tolerance

    def plate(self, like: torch.Tensor, camera_shift: torch.Tensor | None = None) -> torch.Tensor:
        """The real background plate for sim latents ``like`` (B, C, T, H, W): (1, C, 1, H, W), or with
        ``plate_follows_camera`` (B, C, T, H, W), moved per frame by ``camera_shift`` (B, T, 2) px (None: 0) minus
        the fit frames' mean shift (bilinear; the border repeats)."""
        plate = self.plate_real.to(like)
        if not self.config.plate_follows_camera:
            return plate[None, :, None]
        B, _, T, H, W = like.shape
        shift = torch.zeros(B, T, 2) if camera_shift is None else camera_shift.float().cpu().expand(B, T, 2)
        d = (shift - self.plate_shift_px.float().cpu()).reshape(B * T, 2)
        if not d.any():  # a camera that never moved: the plate as fit, untouched by interpolation
            return plate[None, :, None]
        ys, xs = torch.meshgrid(torch.arange(H, dtype=torch.float32), torch.arange(W, dtype=torch.float32), indexing="ij")
        # output pixel (x, y) reads the plate at (x - dx, y - dy): the image moves by the camera's shift
        gx = (xs[None] - d[:, 0, None, None] + 0.5) / W * 2 - 1
        gy = (ys[None] - d[:, 1, None, None] + 0.5) / H * 2 - 1
        grid = torch.stack([gx, gy], -1).to(like.device, plate.dtype)
        moved = F.grid_sample(plate.expand(B * T, -1, -1, -1), grid, mode="bilinear", padding_mode="border",
                              align_corners=False)
        return rearrange(moved, "(b t) c h w -> b c t h w", b=B)

    def residual_start(self, sim_latents: torch.Tensor, camera_shift: torch.Tensor | None = None) -> torch.Tensor:
        """What the x0 prediction adds the network's output to: the sim render (the first C channels of the sim
        condition ``(B, Cs, T, H, W)``), or with the background plate, the real plate (``plate``, following the
        camera's ``camera_shift`` (B, T, 2) px with ``plate_follows_camera``) wherever the twin shows its backdrop."""
        render = sim_latents[:, :self.config.in_channels]
        if not self.config.background_plate:
            return render
        if tuple(sim_latents.shape[-2:]) != tuple(self.plate_sim.shape[-2:]):
            raise ValueError(f"background_plate: the plate is {tuple(self.plate_sim.shape[-2:])} latent pixels, the sim "
                             f"latents are {tuple(sim_latents.shape[-2:])}: a plate model runs at its own resolution")
        return torch.where(self.shows_backdrop(sim_latents), self.plate(render, camera_shift), render)

    # -- helpers ---------------------------------------------------------------------------
    def expected_action_frames(self, latent_frames: int) -> int:
        c = self.config
        return action_frames_for(latent_frames, c.actions_per_latent_frame, c.causal_first_frame)

    def _rope(self, grid, device):
        key = (grid, str(device))
        if key not in self._rope_cache:
            self._rope_cache[key] = rope_3d(grid, self.config.dim // self.config.heads, self.config.rope_theta, device)
        return self._rope_cache[key]

    def _abs_pos(self, grid, device):
        key = ("abs", grid, str(device))
        if key not in self._rope_cache:
            T, H, W = grid
            self._rope_cache[key] = sincos_2d(H, W, self.config.dim, device).repeat(T, 1)
        return self._rope_cache[key]

    def _action_tokens(self, actions, latent_frames):
        """(B, T_pix, A) -> (B, T_tokens, D): one embedding per token-time from its own actions."""
        c = self.config
        if c.causal_first_frame and c.actions_per_latent_frame > 1:  # first latent frame <- one action
            pad = actions[:, :1].expand(-1, c.actions_per_latent_frame - 1, -1)
            actions = torch.cat([pad, actions], dim=1)
        if c.action_fourier:
            freqs = (torch.pi / 2) * 2.0 ** torch.arange(c.action_fourier, device=actions.device, dtype=actions.dtype)
            ang = actions[..., None] * freqs  # (B, T, A, F)
            actions = torch.cat([actions[..., None], ang.sin(), ang.cos()], dim=-1).flatten(2)
        grouped = rearrange(actions, "b (t g) a -> b t (g a)", g=self.actions_per_token)
        return self.action_embed(grouped)

    def _pixel_head(self, h_out, start, sim, mask, grid):
        """The x0 prediction at full resolution: start * (1 + gain) + offset, gain and offset per pixel from the
        tokens' features ``h_out`` (B, N, D) upsampled bilinearly and the twin's features (B, *, T, H, W)."""
        c = self.config
        B, C, T, H, W = start.shape
        (Tt, Ht, Wt), pt, g = grid, c.patch_size[0], c.head_cells
        feat = rearrange(self.head_proj(h_out), "b (t h w) (f pt gh gw) -> (b t pt) f (h gh) (w gw)",
                         t=Tt, h=Ht, w=Wt, pt=pt, gh=g, gw=g)
        feat = F.interpolate(feat, size=(H, W), mode="bilinear", align_corners=False)
        # gathered channels-last in one copy: a 1x1 convolution over few channels is ~3x faster on CPU with the
        # channels innermost
        parts = [feat.permute(0, 2, 3, 1)] + [rearrange(v, "b c t h w -> (b t) h w c") for v in (start, sim, mask)]
        features = torch.cat(parts, dim=-1).permute(0, 3, 1, 2)
        gain, offset = self.head(features).chunk(2, dim=1)
        out = rearrange(start, "b c t h w -> (b t) c h w") * (1 + gain) + offset
        return rearrange(out, "(b t) c h w -> b c t h w", b=B)

    # -- forward ---------------------------------------------------------------------------
    def forward(self, noisy_latents, timestep, actions, sim_latents, action_keep=None, sim_keep=None,
                camera_shift=None):
        c = self.config
        B, C, T, H, W = noisy_latents.shape
        pt, ph, pw = c.patch_size
        if C != c.in_channels or sim_latents.shape[1] != c.sim_channels:
            raise ValueError(f"expected {c.in_channels} latent and {c.sim_channels} sim channels, got "
                             f"{C} and {sim_latents.shape[1]}")
        if sim_latents.shape[2:] != noisy_latents.shape[2:]:
            raise ValueError(f"sim_latents {tuple(sim_latents.shape)} must match noisy_latents {tuple(noisy_latents.shape)} in T, H, W")
        if T % pt or H % ph or W % pw:
            raise ValueError(f"latent size {T}x{H}x{W} is not divisible by patch_size={tuple(c.patch_size)}")
        n_act = self.expected_action_frames(T)
        if actions.shape[0] != B or actions.shape[1] != n_act or actions.shape[2] != c.action_dim:
            raise ValueError(f"actions must be (B={B}, {n_act}, action_dim={c.action_dim}) for {T} latent frames, "
                             f"got {tuple(actions.shape)}")
        ones = torch.ones(B, dtype=torch.bool, device=noisy_latents.device)
        action_keep = ones if action_keep is None else action_keep.to(noisy_latents.device).bool()
        sim_keep = ones if sim_keep is None else sim_keep.to(noisy_latents.device).bool()
        dtype = self.ada_out.weight.dtype

        # sim condition: zeros + mask 0 when dropped; channel concat with the noisy latents
        sk = sim_keep.view(B, 1, 1, 1, 1).to(noisy_latents.dtype)
        mask = sk.expand(B, 1, T, H, W)
        x = torch.cat([noisy_latents, sim_latents * sk, mask], dim=1).to(dtype)
        x = rearrange(x, "b c (t pt) (h ph) (w pw) -> b (t h w) (c pt ph pw)", pt=pt, ph=ph, pw=pw)
        x = self.patch_embed(x) + (~sim_keep).view(B, 1, 1).to(dtype) * self.sim_null
        Tt, Ht, Wt = T // pt, H // ph, W // pw
        if c.abs_pos_embed:
            x = x + self._abs_pos((Tt, Ht, Wt), x.device).to(dtype)

        # conditioning per token-time: timestep (shared) + this frame's action (or the null)
        temb = self.time_embed(self.time_proj(timestep.to(noisy_latents.device).float()).to(dtype))  # (B, D)
        aemb = self._action_tokens(actions.to(dtype), T)  # (B, Tt, D)
        aemb = torch.where(action_keep.view(B, 1, 1), aemb, self.action_null.to(dtype).expand_as(aemb))
        cond = temb[:, None] + aemb

        rope = self._rope((Tt, Ht, Wt), x.device)
        for block in self.blocks:
            if torch.is_grad_enabled() and self.gradient_checkpointing:
                x = self._gradient_checkpointing_func(block, x, cond, rope, Ht * Wt)
            else:
                x = block(x, cond, rope, Ht * Wt)

        shift, scale = self.ada_out(F.silu(cond)).repeat_interleave(Ht * Wt, dim=1).chunk(2, dim=-1)
        h_out = self.norm_out(x) * (1 + scale) + shift
        if self.head is not None:
            start = self.residual_start(sim_latents, camera_shift) * sk
            if c.background_plate:  # without the sim, from the plate (as below)
                start = start + (1 - sk) * self.plate(start, camera_shift)
            x = self._pixel_head(h_out, start.to(dtype), (sim_latents * sk).to(dtype), mask.to(dtype), (Tt, Ht, Wt))
            if c.paste_twin_objects:
                x = self._paste_twin_objects(x, sim_latents, sim_keep)
            return x
        x = rearrange(self.proj_out(h_out), "b (t h w) (c pt ph pw) -> b c (t pt) (h ph) (w pw)",
                      t=Tt, h=Ht, w=Wt, pt=pt, ph=ph, pw=pw)
        if c.sim_residual:
            start = self.residual_start(sim_latents, camera_shift) * sk
            if c.background_plate:  # without the sim, from the plate: every branch shares the cell's background
                start = start + (1 - sk) * self.plate(start, camera_shift)
            x = x + start.to(x.dtype)
            if c.paste_twin_objects:
                x = self._paste_twin_objects(x, sim_latents, sim_keep)
        return x
