"""A Hugging Face Hub cache written by ``huggingface_hub`` itself, offline.

A tiny file server on 127.0.0.1 answers the two requests ``hf_hub_download`` makes for a file
(``HEAD`` then ``GET`` of ``/<repo>/resolve/<revision>/<file>``), so the cache's own code lays
out ``models--org--name/{blobs,refs,snapshots/<commit>}`` with its relative symlinks.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

__all__ = ["COMMIT", "download", "serve"]

#: The commit every served file is said to belong to.
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class _Handler(http.server.BaseHTTPRequestHandler):
    files: Mapping[str, bytes] = {}

    def _headers(self) -> bytes | None:
        _, _, rest = self.path.partition("/resolve/")
        _, _, name = rest.partition("/")
        data = self.files.get(name)
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        return data

    def do_HEAD(self) -> None:
        self._headers()

    def do_GET(self) -> None:
        data = self._headers()
        if data is not None:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serve(files: Mapping[str, bytes]) -> Iterator[str]:
    """Serve ``files`` (name in the repository to bytes) as any repository; yield the endpoint."""
    handler = type("Handler", (_Handler,), {"files": dict(files)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def download(files: Mapping[str, bytes], cache: Path, repo_id: str = "org/name") -> Path:
    """Put ``files`` into the Hub cache ``cache`` with ``hf_hub_download``; return the snapshot.

    Args:
        files: Name in the repository (``"unet/x.safetensors"``) to its bytes.
        cache: The cache folder (``HF_HUB_CACHE``).
        repo_id: The repository.

    Returns:
        ``cache/models--org--name/snapshots/<COMMIT>``, its files links into ``blobs/``.
    """
    from huggingface_hub import hf_hub_download

    with serve(files) as endpoint:
        for name in files:
            hf_hub_download(repo_id, name, cache_dir=cache, endpoint=endpoint)
    return cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / COMMIT
