"""Counter-based seeds: both hashes keep the exact values runs and saved studies were made with."""

from __future__ import annotations

import pytest
import torch

from diffusion_rl.seeding import counter_noise, mix_seed, noise_key

# (counters, noise_key, mix_seed) computed with the implementations that rollout.py and
# inference/noise_to_image.py held before they moved to diffusion_rl/seeding.py
GOLDEN = [
    ((0,), 3596092507173468873, 7960286522194355700),
    ((42, 3, 1, 0, -1), 1774382706282849075, 1550472317555891329),
    ((7, 1_000_003, 5, 2, 9), 7079741295953807223, 2245258093431322205),
    ((-5,), 197955985526675048, 2185194620014831856),
    ((), 3820445788478006404, 2177342782468422677),
]


@pytest.mark.parametrize("counters,key,mixed", GOLDEN)
def test_seeds_keep_their_exact_values(counters, key, mixed):
    assert noise_key(*counters) == key
    assert mix_seed(*counters) == mixed
    assert 0 <= key < 2**63 and 0 <= mixed < 2**63  # valid torch.Generator seeds


def test_counter_noise_rows_depend_only_on_their_own_counters():
    both = counter_noise((3,), 1, 2, [0, 5], [1, 0], 4)
    alone = counter_noise((3,), 1, 2, [5], [0], 4)
    assert torch.equal(both[1], alone[0])
    assert torch.equal(alone[0], torch.randn(3, generator=torch.Generator().manual_seed(noise_key(1, 2, 5, 0, 4))))
    assert not torch.equal(both[0], both[1])
