"""Band-limited resampling by a rational factor (numpy only): a Kaiser-windowed sinc, applied polyphase.

``resample(x, from_rate, to_rate)`` reduces ``to_rate / from_rate`` to
``up / down``, designs one low-pass FIR at the upsampled rate (cut-off at the
lower of the two Nyquist frequencies, ``10 * max(up, down)`` taps either side
of the centre, Kaiser window with beta 5, unit gain at DC) and computes each
output sample as the dot product of the input samples around it with the
filter's phase for that output (the zero-stuffed upsampled signal is never
built). The filter is centred, so the output is not delayed; it has
``ceil(len(x) * up / down)`` samples, the first one at the input's first
instant. The design is the usual polyphase one (it gives what
``scipy.signal.resample_poly`` gives with its defaults, to float rounding).
"""

from __future__ import annotations

from math import gcd

import numpy as np

KAISER_BETA = 5.0
HALF_TAPS_PER_RATE = 10  # the filter's half length, in taps per unit of max(up, down)


def ratio(from_rate: int, to_rate: int) -> tuple[int, int]:
    """``to_rate / from_rate`` as (up, down) in lowest terms."""
    g = gcd(int(from_rate), int(to_rate))
    return int(to_rate) // g, int(from_rate) // g


def lowpass(up: int, down: int) -> np.ndarray:
    """The anti-aliasing filter at the upsampled rate (module doc), float64, odd length, centred."""
    rate = max(up, down)
    half = HALF_TAPS_PER_RATE * rate
    m = np.arange(-half, half + 1, dtype=np.float64)
    cutoff = 1.0 / rate  # of the upsampled Nyquist frequency
    taps = cutoff * np.sinc(cutoff * m) * np.kaiser(2 * half + 1, KAISER_BETA)
    return taps / taps.sum()


def resample(x: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """``x`` (1-D) sampled at ``from_rate`` as float32 samples at ``to_rate`` (module doc)."""
    x = np.asarray(x, dtype=np.float64)
    if from_rate == to_rate or x.size == 0:
        return x.astype(np.float32)
    up, down = ratio(from_rate, to_rate)
    h = lowpass(up, down) * up  # the zero-stuffing keeps 1 sample in `up`: gain `up` restores the level
    half = (len(h) - 1) // 2
    n_taps = -(-len(h) // up)  # taps of one phase
    h = np.concatenate([h, np.zeros(n_taps * up - len(h))])
    phases = h.reshape(n_taps, up).T  # phases[p, k] = h[p + k * up]
    n_out = -(-x.size * up // down)
    # input samples n_taps before the first and after the last stay zero
    padded = np.concatenate([np.zeros(n_taps), x, np.zeros(n_taps)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, n_taps)  # windows[i] = padded[i : i + n_taps]
    out = np.empty(n_out, dtype=np.float64)
    # y[n] = sum_k x[base - k] * h[phase + k * up] with t = n * down + half, phase = t % up, base = t // up: the
    # outputs n0, n0 + up, n0 + 2 up, ... share a phase and their bases step by `down`, so each such run is one
    # matrix-vector product over every `down`-th window
    for n0 in range(min(up, n_out)):
        t = n0 * down + half
        phase, base = t % up, t // up
        count = len(range(n0, n_out, up))
        start = base + 1  # x[base - k] is padded[base + n_taps - k]: window base + 1 read backwards
        out[n0::up] = windows[start : start + (count - 1) * down + 1 : down] @ phases[phase, ::-1]
    return out.astype(np.float32)
