"""Schemathesis hooks for ``tests/test_openapi_contract.py``, loaded by the ``st`` process it runs
(``SCHEMATHESIS_HOOKS=contract_hooks``); the test passes what they need in the environment.

- The signed API's requests are signed as seed 000 part 5 says: the provider's paths with the test's
  provider account, the callback with the upstream's credentials. Without a signature every one of them
  would only ever be answered 401.
- ``PUT /api/v1/offers/{code}`` takes the offer's code in its body too, and then it must be the path's: a
  rule across the path and the body that JSON Schema cannot state. A generated valid body that carries a
  code carries the path's.
- ``positive_data_acceptance`` is run too. The only valid requests the daemon may refuse are those that
  name something this installation does not have (an upstream, SKU, offer, account, price tier): their
  answers, with the codes listed in :data:`UNKNOWN_REFERENCES`, are documented and accepted here; any
  other refusal of a valid request is a failure.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from typing import Any
from urllib.parse import urlsplit

import requests
import schemathesis
from schemathesis.auths import RequestsAuth
from schemathesis.core.parameters import ParameterLocation

CALLBACK_PATH = "/api/v1/upstream/callback"
SIGNED_PATHS = r"^/api/v1/upstream/(?!callback$)"
LOCAL_CALLBACK_URL = "http://127.0.0.1:9/api/v1/upstream/callback"  # the discard port: nothing listens

# A valid request's refusal because what it names does not exist here: (status, error_code).
UNKNOWN_REFERENCES = frozenset(
    {
        (400, "unknown_upstream"),  # an exception filter naming an upstream that is not configured
        (404, "unknown_upstream"),  # a catalogue pass or price hold of such an upstream
        (422, "unknown_upstream"),  # an order item or offer source of such an upstream
        (422, "sku_not_found"),  # an order item of a SKU the mirror does not hold
        (422, "offer_not_found"),  # an order item of an offer that does not exist
        (400, "unknown_level"),  # a price tier that [[provider.levels]] does not have
        (400, "sku_unavailable"),  # a signed order of a SKU the provider does not offer
    }
)


class Signature(requests.auth.AuthBase):
    """Seed 000 part 5: HMAC-SHA256 of method, path, timestamp and the body's MD5, in three headers."""

    def __init__(self, prefix: str, api_key: str, secret: str) -> None:
        self.prefix = prefix
        self.api_key = api_key
        self.secret = secret

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        body = request.body or b""
        raw = body.encode() if isinstance(body, str) else body
        assert isinstance(raw, bytes), "a streamed body cannot be signed"
        timestamp = str(int(time.time()))
        path = urlsplit(request.url or "").path
        text = "\n".join((request.method or "", path, timestamp, hashlib.md5(raw).hexdigest()))  # noqa: S324
        signature = hmac.new(self.secret.encode(), text.encode(), hashlib.sha256).hexdigest()
        request.headers[f"{self.prefix}-Api-Key"] = self.api_key
        request.headers[f"{self.prefix}-Timestamp"] = timestamp
        request.headers[f"{self.prefix}-Signature"] = signature
        return request


def _signature(role: str) -> Signature:
    prefix, api_key, secret = json.loads(os.environ[f"PROCURD_CONTRACT_{role}"])
    return Signature(prefix, api_key, secret)


class Signing:
    """Signs a request with ``signature``, unless the case was generated without valid headers (a negative
    case of the three signature headers: it is sent as generated, to be refused)."""

    def __init__(self, signature: Signature) -> None:
        self.requests_auth: RequestsAuth[Any] = RequestsAuth(signature)

    def get(self, case: Any, context: Any) -> Any:
        if case.meta.is_negative_at(ParameterLocation.HEADER):
            return None
        return self.requests_auth.get(case, context)

    def set(self, case: Any, data: Any, context: Any) -> None:
        self.requests_auth.set(case, data, context)


@schemathesis.auth(refresh_interval=None).apply_to(path_regex=SIGNED_PATHS)
class AccountSigning(Signing):
    """The provider's paths, as the test's provider account."""

    def __init__(self) -> None:
        super().__init__(_signature("ACCOUNT"))


@schemathesis.auth(refresh_interval=None).apply_to(path=CALLBACK_PATH)
class UpstreamSigning(Signing):
    """The callback, as the upstream ``main``."""

    def __init__(self) -> None:
        super().__init__(_signature("UPSTREAM"))


def _whole_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(item) for item in value]
    return value


def _valid_body(case: Any) -> bool:
    return isinstance(case.body, dict) and not case.meta.is_negative_at(ParameterLocation.BODY)


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    """What JSON Schema cannot say of a request, said for the generated ones:

    - a whole number is written as one (``78``, not ``78.0``), as the document says of every integer in a
      request (JSON Schema holds both the same, so whether a value is valid does not change);
    - a valid offer body that names a code names the path's;
    - a valid signed order's ``callback_url`` points at a closed port of this machine: the test makes no
      connection to the hosts a generated or example URL names.
    """
    if isinstance(case.body, dict | list):
        case.body = _whole_numbers(case.body)
    operation = (case.operation.method.upper(), case.operation.path)
    offer = operation == ("PUT", "/api/v1/offers/{code}") and _valid_body(case) and "code" in case.body
    if offer and not case.meta.is_negative_at(ParameterLocation.PATH):
        case.body = {**case.body, "code": case.path_parameters["code"]}
    if operation == ("POST", "/api/v1/upstream/orders") and _valid_body(case):
        url = case.body.get("callback_url")
        if isinstance(url, str) and "://" in url:
            case.body = {**case.body, "callback_url": LOCAL_CALLBACK_URL}
    return case


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but a valid request's documented refusal for naming something that does not
    exist here (``UNKNOWN_REFERENCES``)."""
    if "positive_data_acceptance" not in getattr(failure, "checks", ()):
        return True
    try:
        body = response.json()
    except ValueError:
        return True
    code = body.get("error_code") if isinstance(body, dict) else None
    return (response.status_code, code) not in UNKNOWN_REFERENCES
