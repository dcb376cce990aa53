from django.core.management.base import BaseCommand, CommandError

from payments.clients import SCOPES, api_client_create


class Command(BaseCommand):
    help = "Create a storefront API client and print its key once (last line: the key alone)."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument(
            "--scopes",
            nargs="+",
            default=["purchases:read", "purchases:write"],
            help=f"any of: {' '.join(SCOPES)}",
        )
        parser.add_argument("--limit", type=int, default=0, help="minor units; 0 = no limit")
        parser.add_argument("--currency", default="usd")
        parser.add_argument("--period", default="none", choices=["none", "day", "month"])
        parser.add_argument("--auto-refund-limit", type=int, default=0)
        parser.add_argument(
            "--storefront-confirmation",
            action="store_true",
            help="a storefront (not an agent) whose own checkout asks the "
            "buyer: its acknowledge_unresolved lifts the purchase guards",
        )

    def handle(
        self,
        *args,
        name,
        scopes,
        limit,
        currency,
        period,
        auto_refund_limit,
        storefront_confirmation=False,
        **kw,
    ):
        scopes = [s for chunk in scopes for s in chunk.split(",") if s]
        try:
            client, key = api_client_create(
                name=name,
                scopes=scopes,
                limit=limit,
                currency=currency,
                limit_period=period,
                auto_refund_limit=auto_refund_limit,
                storefront_confirmation=storefront_confirmation,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"API client {client.name} ({client.prefix}) scopes={','.join(scopes)} "
            f"limit={limit} {currency.lower()}; the key is shown once:"
        )
        self.stdout.write(key)
