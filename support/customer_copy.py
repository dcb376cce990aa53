"""The customer's words live beside the presenter, in payments/customer_copy.py (the API,
the MCP tools, the console and the customer page all read them there). Re-exported here
for the console's templates and callers."""

from payments.customer_copy import WORDS, CustomerState, StateCode, customer_state, wording

__all__ = ["WORDS", "CustomerState", "StateCode", "customer_state", "wording"]
