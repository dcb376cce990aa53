"""x402 settings that make a development shortcut stand for money on a real network stop
the process at start: the local-chain flag off the local chain, and fewer confirmations
than the network's floor (a reorg would take a delivered payment away)."""

from tests.security.test_startup_refusals import _check

REAL = {
    "DEBUG": "true",
    "X402_ENABLED": "true",
    "X402_NETWORK": "eip155:8453",
    "X402_FACILITATOR_URL": "https://facilitator.example",
    "X402_PAY_TO": "0x" + "12" * 20,
    "X402_ASSET": "0x" + "34" * 20,
}


def test_the_local_chain_flag_on_a_real_network_refuses_to_start():
    result = _check(**REAL, X402_CONFIRMATIONS="10", X402_LOCAL_CHAIN="true")
    assert result.returncode != 0 and "X402_LOCAL_CHAIN" in result.stderr, result.stderr
    assert _check(**REAL, X402_CONFIRMATIONS="10").returncode == 0


def test_confirmations_below_the_networks_floor_refuse_to_start():
    result = _check(**REAL, X402_CONFIRMATIONS="1")
    assert result.returncode != 0 and "X402_CONFIRMATIONS" in result.stderr, result.stderr
    # on the local chain one confirmation is `make run` itself
    assert _check(DEBUG="true", X402_ENABLED="true", X402_CONFIRMATIONS="1").returncode == 0
