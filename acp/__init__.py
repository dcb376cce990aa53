"""Agentic Commerce Protocol: the merchant's five checkout-session endpoints.

An interface layer like `agents`: a checkout session is a quote becoming one purchase,
through payments.services (the same holds, guards, halts, limits and reconciliation as the
REST API and MCP). Nothing here calls the provider.
"""
