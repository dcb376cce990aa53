import pytest

from payments import services
from tests.factories import ProductFactory, make_client


