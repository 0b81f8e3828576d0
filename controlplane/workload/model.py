"""A small, deterministic numpy training loop: 2-layer MLP regression trained with Adam.

Everything that influences the next step is part of ``TrainState`` (weights, Adam moments,
step counter, data position and the noise RNG's exact bit-generator state), so a state
restored from a checkpoint continues bit-for-bit like the run that wrote it.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

N_SAMPLES = 512
N_FEATURES = 16
HIDDEN = 32


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200
    checkpoint_every: int = 20
    seed: int = 7
    batch_size: int = 32
    learning_rate: float = 0.01
    # Gaussian input noise drawn from the run's RNG each step: makes the RNG state matter.
    input_noise: float = 0.05

    def validate(self) -> None:
        if self.steps < 1:
            raise ValueError(f"params.steps must be >= 1, got {self.steps}")
        if self.checkpoint_every < 1:
            raise ValueError(f"params.checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if not 1 <= self.batch_size <= N_SAMPLES:
            raise ValueError(f"params.batch_size must be in 1..{N_SAMPLES}, got {self.batch_size}")


@dataclass
class TrainState:
    theta: np.ndarray  # all parameters, flat float64
    m: np.ndarray  # Adam first moment
    v: np.ndarray  # Adam second moment
    step: int  # steps completed
    epoch: int  # data position: epoch ...
    batch_index: int  # ... and next batch within it
    rng: np.random.Generator
    last_loss: float = float("nan")


def _shapes() -> list[tuple[int, ...]]:
    return [(N_FEATURES, HIDDEN), (HIDDEN,), (HIDDEN, 1), (1,)]


def _unpack(theta: np.ndarray) -> list[np.ndarray]:
    parts, offset = [], 0
    for shape in _shapes():
        size = int(np.prod(shape))
        parts.append(theta[offset : offset + size].reshape(shape))
        offset += size
    return parts


def make_dataset(seed: int, inputs_sha256: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic regression data, a pure function of the seed (no downloads) and, for a
    pipeline step, of the sha256 of the input bytes it verified (other bytes, other data)."""
    words = ([int(inputs_sha256[i:i + 8], 16) for i in range(0, 64, 8)]
             if inputs_sha256 else [])
    rng = np.random.default_rng([seed, 0xDA7A, *words])
    x = rng.normal(size=(N_SAMPLES, N_FEATURES))
    w = rng.normal(size=(N_FEATURES,))
    y = np.tanh(x @ w / 4.0) + 0.1 * np.sin(x[:, 0] * 3.0)
    return x, y.reshape(-1, 1)


def init_state(config: TrainConfig) -> TrainState:
    init_rng = np.random.default_rng([config.seed, 0x1417])
    theta = np.concatenate(
        [init_rng.normal(scale=1.0 / np.sqrt(shape[0]), size=shape).ravel() for shape in _shapes()]
    )
    return TrainState(
        theta=theta, m=np.zeros_like(theta), v=np.zeros_like(theta), step=0, epoch=0,
        batch_index=0, rng=np.random.default_rng([config.seed, 0x5EED]),
    )


def _epoch_order(seed: int, epoch: int) -> np.ndarray:
    # The shuffle of an epoch is derived from (seed, epoch): the data position is just two ints.
    return np.random.default_rng([seed, 0x0DE5, epoch]).permutation(N_SAMPLES)


def train_step(state: TrainState, data: tuple[np.ndarray, np.ndarray], config: TrainConfig) -> None:
    x_all, y_all = data
    batches_per_epoch = N_SAMPLES // config.batch_size
    order = _epoch_order(config.seed, state.epoch)
    idx = order[state.batch_index * config.batch_size : (state.batch_index + 1) * config.batch_size]
    x = x_all[idx] + state.rng.normal(scale=config.input_noise, size=(len(idx), N_FEATURES))
    y = y_all[idx]

    w1, b1, w2, b2 = _unpack(state.theta)
    h_pre = x @ w1 + b1
    h = np.tanh(h_pre)
    pred = h @ w2 + b2
    err = pred - y
    loss = float(np.mean(err**2))

    d_pred = 2.0 * err / len(idx)
    g_w2 = h.T @ d_pred
    g_b2 = d_pred.sum(axis=0)
    d_h = (d_pred @ w2.T) * (1.0 - h**2)
    g_w1 = x.T @ d_h
    g_b1 = d_h.sum(axis=0)
    grad = np.concatenate([g.ravel() for g in (g_w1, g_b1, g_w2, g_b2)])

    beta1, beta2, eps = 0.9, 0.999, 1e-8
    t = state.step + 1
    state.m = beta1 * state.m + (1 - beta1) * grad
    state.v = beta2 * state.v + (1 - beta2) * grad**2
    m_hat = state.m / (1 - beta1**t)
    v_hat = state.v / (1 - beta2**t)
    state.theta = state.theta - config.learning_rate * m_hat / (np.sqrt(v_hat) + eps)

    state.step = t
    state.last_loss = loss
    state.batch_index += 1
    if state.batch_index >= batches_per_epoch:
        state.epoch += 1
        state.batch_index = 0


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def serialize(state: TrainState, config: TrainConfig) -> dict[str, bytes]:
    """Checkpoint files (CONTRACTS.md section 3): weights, optimizer state, data position + RNG."""
    opt = io.BytesIO()
    np.savez(opt, m=state.m, v=state.v, t=np.array(state.step))
    meta: dict[str, Any] = {
        "step": state.step,
        "epoch": state.epoch,
        "batch_index": state.batch_index,
        "rng": state.rng.bit_generator.state,
        "last_loss": state.last_loss,
        "config": {"seed": config.seed, "batch_size": config.batch_size,
                   "learning_rate": config.learning_rate, "input_noise": config.input_noise},
    }
    return {
        "weights.npy": npy_bytes(state.theta),
        "optimizer.npz": opt.getvalue(),
        "state.json": json.dumps(meta, sort_keys=True).encode(),
    }


def deserialize(files: dict[str, bytes], config: TrainConfig) -> TrainState:
    meta = json.loads(files["state.json"])
    saved = meta["config"]
    mine = {"seed": config.seed, "batch_size": config.batch_size,
            "learning_rate": config.learning_rate, "input_noise": config.input_noise}
    if saved != mine:
        # Resuming another configuration's state would silently produce a different model.
        raise ValueError(f"checkpoint config {saved} does not match this run's {mine}")
    theta = np.load(io.BytesIO(files["weights.npy"]), allow_pickle=False)
    with np.load(io.BytesIO(files["optimizer.npz"]), allow_pickle=False) as opt:
        m, v, t = opt["m"], opt["v"], int(opt["t"])
    if t != meta["step"]:
        raise ValueError(f"optimizer step {t} != state step {meta['step']}")
    rng = np.random.default_rng()
    rng.bit_generator.state = meta["rng"]
    return TrainState(theta=theta, m=m, v=v, step=meta["step"], epoch=meta["epoch"],
                      batch_index=meta["batch_index"], rng=rng, last_loss=meta["last_loss"])
