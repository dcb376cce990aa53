"""Stand-in for the storefront's checkout page (`STOREFRONT_CHECKOUT_URL`) in the demo.

Verity never collects card data: "pay again" on a status page sends the customer to the
storefront. In `make run` there is no storefront, so this page says where they would be.
"""
from django.http import HttpResponse
from django.utils.html import escape


def demo_checkout(request, purchase_id: str):
    return HttpResponse(
        "<!doctype html><html lang=en><meta charset=utf-8><title>Demo storefront</title>"
        f"<main><h1>Storefront checkout (demo)</h1><p>Purchase {escape(purchase_id)}: here "
        "the storefront would ask for another payment method and call "
        "<code>POST /api/v1/purchases/{id}/payments</code> with <code>retry_of</code>."
        "</p></main></html>",
        headers={"Content-Security-Policy": "default-src 'none'"})
