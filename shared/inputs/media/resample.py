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
CHUNK = 1 << 15  # outputs computed per step (bounds the (outputs, taps) index block)


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
    # input samples n_taps - 1 before the first and after the last stay zero
    padded = np.concatenate([np.zeros(n_taps), x, np.zeros(n_taps)])
    out = np.empty(n_out, dtype=np.float64)
    k = np.arange(n_taps)
    for start in range(0, n_out, CHUNK):
        n = np.arange(start, min(start + CHUNK, n_out), dtype=np.int64)
        t = n * down + half  # the output's position in the upsampled signal, shifted by the filter's centre
        phase, base = t % up, t // up  # y[n] = sum_k x[base - k] * h[phase + k * up]
        rows = padded[(base + n_taps)[:, None] - k[None, :]]  # (outputs, taps)
        out[n] = np.einsum("ij,ij->i", rows, phases[phase])
    return out.astype(np.float32)
