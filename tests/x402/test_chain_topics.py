"""The event topics the chain reader matches are written as constants (so importing the
rail does not import web3): they are the keccak256 of the events' signatures."""

from payments.providers.x402 import chain, sdk


def test_the_topic_constants_are_the_keccak_of_the_event_signatures():
    def topic(signature: str) -> str:
        return "0x" + sdk.Web3.keccak(text=signature).hex().removeprefix("0x")

    assert chain._TRANSFER_TOPIC == topic("Transfer(address,address,uint256)")
    assert chain._AUTHORIZATION_USED_TOPIC == topic("AuthorizationUsed(address,bytes32)")
