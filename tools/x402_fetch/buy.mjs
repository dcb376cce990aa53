// The x402 project's own npm client, unmodified: @x402/fetch wrapping Node's fetch with
// the EVM `exact` scheme (@x402/evm) and a viem local account. One GET of a paid URL:
// on 402 it signs an EIP-3009 authorization and repeats the request with
// PAYMENT-SIGNATURE; any other answer is returned as it is (a 202 is not paid again).
//
// Environment (secrets never on the command line): X402_BUYER_KEY (the payer's private
// key, 0x...), VERITY_API_KEY (sent as `Authorization: Api-Key ...`), and the buyer's spend
// policy: X402_NETWORK, X402_ASSET (the local chain's USDC is not one of the client's
// default assets, so it is allowed explicitly, as with the Python SDK) and
// X402_MAX_AMOUNT (the per-payment cap, atomic units; default 20 USDC).
// Usage: node tools/x402_fetch/buy.mjs URL
// Prints one JSON line: {"status", "body", "paymentResponse"} (the decoded PAYMENT-RESPONSE).
import { decodePaymentResponseHeader, wrapFetchWithPaymentFromConfig } from "@x402/fetch";
import { ExactEvmScheme } from "@x402/evm";
import { privateKeyToAccount } from "viem/accounts";

const url = process.argv[2];
const account = privateKeyToAccount(process.env.X402_BUYER_KEY);
const fetchWithPayment = wrapFetchWithPaymentFromConfig(fetch, {
  schemes: [{ network: "eip155:*", client: new ExactEvmScheme(account) }],
  spendControls: {
    allowedAssets: [{
      network: process.env.X402_NETWORK,
      asset: process.env.X402_ASSET,
      maxAmountPerPayment: process.env.X402_MAX_AMOUNT || "20000000",
    }],
  },
});

const response = await fetchWithPayment(url, {
  method: "GET",
  headers: { Authorization: `Api-Key ${process.env.VERITY_API_KEY}` },
});
const header = response.headers.get("PAYMENT-RESPONSE");
const text = await response.text();
let body;
try {
  body = JSON.parse(text);
} catch {
  body = text;
}
console.log(JSON.stringify({
  status: response.status,
  body,
  paymentResponse: header ? decodePaymentResponseHeader(header) : null,
}));
