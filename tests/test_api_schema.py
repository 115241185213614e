"""The OpenAPI schema describes every reply: schemathesis generates requests from it (bounded
examples) against a real uvicorn server and checks no 5xx and no reply outside the schema."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.conftest import ServerThread
from tests.small_index import build_small_index, small_app

ROUTES = "^/(ask|validate-config|healthz|readyz)$"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    index = build_small_index(tmp_path_factory)
    with ServerThread(small_app(index)) as s:
        yield s


def test_every_reply_is_in_the_schema_and_never_a_5xx(server: ServerThread) -> None:
    loaded = schemathesis.openapi.from_url(server.url + "/openapi.json").include(path_regex=ROUTES)
    operations = [result.ok() for result in loaded.get_all_operations()]
    assert len(operations) >= 4

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def check(case) -> None:  # noqa: ANN001 - a schemathesis case
            response = case.call(base_url=server.url)
            assert response.status_code < 500, (case.path, case.body, response.text[:300])
            # every reply documented, in its schema and content type; schema-valid JSON may still be
            # refused with a documented 422 (a lone surrogate in a string: valid JSON, invalid Unicode)
            case.validate_response(response, excluded_checks=[positive_data_acceptance])

        check()
