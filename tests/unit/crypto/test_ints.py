"""The shared integer helpers (confide.crypto.ints) that the Paillier code paths all use."""

from hypothesis import given
from hypothesis import strategies as st

from confide.crypto.ints import centered, int_to_bytes


@given(st.integers(min_value=0, max_value=2**4096))
def test_int_to_bytes_is_minimal_and_round_trips(value):
    data = int_to_bytes(value)
    assert int.from_bytes(data, "big") == value
    assert len(data) == max(1, -(-value.bit_length() // 8))


@given(st.integers(min_value=3, max_value=2**2048), st.data())
def test_centered_recovers_any_signed_value_below_half_of_n(n, data):
    v = data.draw(st.integers(min_value=-((n - 1) // 2), max_value=n // 2))
    assert centered(v % n, n) == v
    assert centered(v + 5 * n, n) == v
    assert -n // 2 < centered(data.draw(st.integers()), n) <= n // 2
