"""Stand-in for the storefront's checkout page (`STOREFRONT_CHECKOUT_URL`) in the demo.

Verity never collects card data: "pay again" on a status page sends the customer to the
storefront. In `make run` there is no storefront, so this page says where they would be.
"""

from django.shortcuts import render


def demo_checkout(request, purchase_id: str):
    # A page in the status pages' style (templates/status/demo_checkout.html), not a bare
    # developer stub: it is where a customer's "Pay again" or "Finish the confirmation" lands.
    response = render(request, "status/demo_checkout.html", {"purchase_id": purchase_id})
    response["Content-Security-Policy"] = "default-src 'none'; style-src 'self'"
    response["X-Robots-Tag"] = "noindex, nofollow"
    return response
