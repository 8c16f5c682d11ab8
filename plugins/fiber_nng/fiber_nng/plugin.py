"""The plugin: answers ``fiber_transport`` when the configuration asks for ``transport = "nng"``
(``FIBER_TRANSPORT=nng``), with the same TLS settings as the built-in transport
(``tls``, ``tls_cert_file``, ``tls_ca_file``, ``tls_server_name``).

Written on fibercore's public names only (:mod:`fibercore.transport`, the contract; the
``hookimpl`` marker; :mod:`fibercore.types`), as a third party would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fibercore import hookimpl

if TYPE_CHECKING:
    from fiber_nng.transport import NngTransport
    from fibercore.types import ConfigView

NAME = "nng"


class NngPlugin:
    FIBER_CONTRACT = 3

    @hookimpl
    def fiber_transport(self, config: ConfigView) -> NngTransport | None:
        if config is None or (config.get("transport") or "tcp") != NAME:
            return None
        from fiber_nng.transport import NngTransport

        tls = None
        if config.get("tls"):
            tls = {"cert": config.get("tls_cert_file"), "ca": config.get("tls_ca_file"),
                   "server_name": config.get("tls_server_name")}
        return NngTransport(tls)


plugin = NngPlugin()
