"""Weight sync through Polar's fence, shaped as TRL's weight-transfer protocol (init_weight_transfer, pause,
send_weights, resume, destroy): pause every proxy (`polar policy pause`: new LLM calls are held, in-flight ones
drain), write the trainer's weights as safetensors to a folder the engines read, call each engine replica's
`/update_weights_from_disk` (SGLang's endpoint; `polar serve` speaks it) with the new version, resume. Later
calls carry that version as their records' `policy_version`."""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import torch

CONFIG_FILES = ("config.json", "generation_config.json")


@dataclass
class SyncTimes:
    """Seconds spent in the last sync, by part."""
    pause_s: float = 0.0
    save_s: float = 0.0
    load_s: float = 0.0
    total_s: float = 0.0


@dataclass
class FenceWeightTransfer:
    client: Any  # polar.client.PolarClient: pause()/resume() are the fence
    engines: list[str]  # every engine replica's base URL
    base_model: Path  # its config files go beside each checkpoint
    folder: Path  # shared with the engines: checkpoints land in folder/v<version>
    version: int = 0  # the version the engines serve; each send_weights adds one
    keep: int = 2  # checkpoints kept on disk
    timeout_s: float = 120.0
    times: SyncTimes = field(default_factory=SyncTimes)
    _t0: float = 0.0

    def init_weight_transfer(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def pause(self) -> None:
        self._t0 = time.monotonic()
        self.client.pause(self.timeout_s)
        self.times.pause_s = time.monotonic() - self._t0

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Write (name, tensor) pairs as one safetensors file, then have every engine load it."""
        from safetensors.torch import save_file

        t0 = time.monotonic()
        version = self.version + 1
        dest = self.folder / f"v{version}"
        tmp = self.folder / f".v{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # clone: tied weights share storage, which save_file refuses
        save_file({name: t.detach().to("cpu").clone().contiguous() for name, t in iterator},
                  str(tmp / "model.safetensors"))
        for name in CONFIG_FILES:
            if (self.base_model / name).is_file():
                shutil.copyfile(self.base_model / name, tmp / name)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)  # whole before any engine reads it
        t1 = time.monotonic()
        for url in self.engines:
            self._load(url, dest, version)
        self.version = version
        self.times.save_s, self.times.load_s = t1 - t0, time.monotonic() - t1
        for old in sorted(self.folder.glob("v*"), key=lambda p: int(p.name[1:]))[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def _load(self, url: str, path: Path, version: int) -> None:
        r = httpx.post(f"{url}/update_weights_from_disk", timeout=self.timeout_s,
                       json={"model_path": str(path), "weight_version": str(version)})
        body = r.json()
        if r.status_code != 200 or not body.get("success") or str(body.get("weight_version")) != str(version):
            raise RuntimeError(f"{url}: weight update to v{version} failed: {r.status_code} {body}")

    def resume(self) -> None:
        self.client.resume()
        self.times.total_s = time.monotonic() - self._t0

    def destroy(self) -> None:
        pass

    def push(self, model: torch.nn.Module) -> int:
        """One whole sync of `model`'s weights; returns the new version. The fence is lifted even on failure."""
        self.pause()
        try:
            self.send_weights(iter(model.state_dict().items()))
        finally:
            self.resume()
        return self.version


def engine_versions(engines: list[str]) -> list[str]:
    """Each replica's reported weight_version (GET /get_model_info)."""
    return [str(httpx.get(f"{u}/get_model_info", timeout=10).json()["weight_version"]) for u in engines]
