"""Request parsing: the JSON parser that turns too-deep nesting into a 400, not a 500."""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class BoundedJSONParser(JSONParser):
    """`json.loads` raises RecursionError (not ValueError) on a body nested a few thousand
    levels deep, which DRF's parser does not catch: a 3 000-deep array was a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
