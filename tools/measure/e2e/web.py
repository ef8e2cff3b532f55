"""The e2e tools' one HTTP call: JSON to and from the api-server's REST API and PyPI's simple API."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping
from typing import Any


def call(url: str, data: Any = None, headers: Mapping[str, str] | None = None, timeout: float = 10.0) -> Any:
    """The JSON answer to GET ``url``, or to POST ``data`` as JSON; urllib's HTTPError for a 4xx or 5xx."""
    body = None if data is None else json.dumps(data).encode()
    request = urllib.request.Request(
        url, data=body, headers={"Accept": "application/json", **(headers or {})}
    )
    if body is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")
