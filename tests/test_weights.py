import functools
import hashlib
import http.server
import json
import os
import shutil
import threading

import h5py
import numpy as np
import pytest
import torch

from torchelmo import BiLM, ElmoConfig, ElmoError
from torchelmo.model import registry as R
from torchelmo.model import weights as W

SENTS = [["The", "cat", "sat", "."], ["Ein", "Satz", "über", "北京", "😀"], ["x"]]


def _outputs(model):
    with torch.no_grad():
        return model.embed_sentences(SENTS).layers


def test_round_trip_native_and_published(fixture_model, tmp_path):
    ref = _outputs(fixture_model)
    fixture_model.save_pretrained(tmp_path / "native")
    native = BiLM.from_pretrained(tmp_path / "native")
    opts, wts = native.export_published(tmp_path / "published", name="mine")
    assert opts.name == "mine_options.json" and wts.name == "mine_weights.hdf5"
    again = BiLM.from_published(opts, wts)
    again_dir = BiLM.from_pretrained(tmp_path / "published")
    for model in (native, again, again_dir):
        for a, b in zip(ref, _outputs(model)):
            assert torch.equal(a, b)
    # The export is the published layout, dataset for dataset, value for value.
    with h5py.File(shared_fixture_weights(), "r") as src, h5py.File(wts, "r") as dst:
        names = []
        src.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for n in names:
            np.testing.assert_array_equal(src[n][...], dst[n][...], err_msg=n)


def shared_fixture_weights():
    from conftest import shared_path
    return shared_path("fixtures", "allennlp-elmo", "lm_weights.hdf5")


def test_native_directory_contents(fixture_model, tmp_path):
    fixture_model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert ElmoConfig.from_options(cfg) == fixture_model.config
    assert (tmp_path / "model.safetensors").stat().st_size > 0
    # Written atomically, yet with the permissions of a plain open(): shareable, not owner-only.
    umask = os.umask(0)
    os.umask(umask)
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


# -- bad input --------------------------------------------------------------------------------------
def _options(allennlp_dir):
    return json.loads((allennlp_dir / "options.json").read_text())


def _write(tmp_path, options):
    p = tmp_path / "options.json"
    p.write_text(json.dumps(options))
    return p


def test_missing_option_key(allennlp_dir, tmp_path):
    o = _options(allennlp_dir)
    del o["lstm"]["projection_dim"]
    with pytest.raises(ElmoError, match=r"options\.json: missing option lstm\.projection_dim"):
        ElmoConfig.from_json_file(_write(tmp_path, o))
    o = _options(allennlp_dir)
    del o["char_cnn"]
    with pytest.raises(ElmoError, match="missing option char_cnn"):
        ElmoConfig.from_json_file(_write(tmp_path, o))


def test_extra_option_key(allennlp_dir, tmp_path):
    o = _options(allennlp_dir)
    o["lstm"]["dimension"] = 3
    with pytest.raises(ElmoError, match=r"options\.json: unknown option lstm\.dimension"):
        ElmoConfig.from_json_file(_write(tmp_path, o))
    o = _options(allennlp_dir)
    o["dropout"], o["n_epochs"] = 0.1, 10  # training-config keys are fine
    ElmoConfig.from_json_file(_write(tmp_path, o))


def test_n_characters(allennlp_dir, tmp_path):
    o = _options(allennlp_dir)
    o["char_cnn"]["n_characters"] = 300
    with pytest.raises(ElmoError, match=r"options\.json: option char_cnn\.n_characters is 300"):
        ElmoConfig.from_json_file(_write(tmp_path, o))
    o["char_cnn"]["n_characters"] = 261  # a bilm-tf training config: documented, accepted
    assert ElmoConfig.from_json_file(_write(tmp_path, o)).n_characters == 262


@pytest.mark.core
def test_bad_json(tmp_path):
    p = tmp_path / "options.json"
    p.write_text('{"lstm": ')
    with pytest.raises(ElmoError, match="not valid JSON"):
        ElmoConfig.from_json_file(p)
    with pytest.raises(ElmoError, match="absent.json: no such options file"):
        ElmoConfig.from_json_file(tmp_path / "absent.json")


def _copy_weights(allennlp_dir, tmp_path, edit):
    dst = tmp_path / "w.hdf5"
    shutil.copy(allennlp_dir / "lm_weights.hdf5", dst)
    with h5py.File(dst, "a") as f:
        edit(f)
    return dst


def test_hdf5_missing_dataset(allennlp_dir, tmp_path):
    wts = _copy_weights(allennlp_dir, tmp_path,
                        lambda f: f.__delitem__("RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0"))
    with pytest.raises(ElmoError, match=r"w\.hdf5: missing dataset 'RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0'"):
        BiLM.from_published(allennlp_dir / "options.json", wts)


def test_hdf5_wrong_shape(allennlp_dir, tmp_path):
    def edit(f):
        del f["CNN_proj/W_proj"]
        f.create_dataset("CNN_proj/W_proj", data=np.zeros((124, 17), np.float32))
    wts = _copy_weights(allennlp_dir, tmp_path, edit)
    with pytest.raises(ElmoError, match=r"dataset 'CNN_proj/W_proj' has shape \(124, 17\), the options imply \(124, 16\)"):
        BiLM.from_published(allennlp_dir / "options.json", wts)


def test_options_disagree_with_weights(allennlp_dir, tmp_path):
    o = _options(allennlp_dir)
    o["char_cnn"]["n_highway"] = 3
    with pytest.raises(ElmoError, match="missing dataset 'CNN_high_2/W_transform'"):
        BiLM.from_published(_write(tmp_path, o), allennlp_dir / "lm_weights.hdf5")


def test_not_hdf5(allennlp_dir, tmp_path):
    bad = tmp_path / "weights.hdf5"
    bad.write_bytes(b"this is not an HDF5 file\n" * 10)
    with pytest.raises(ElmoError, match=r"weights\.hdf5: not an HDF5 file"):
        BiLM.from_published(allennlp_dir / "options.json", bad)
    with pytest.raises(ElmoError, match="file not found"):
        BiLM.from_published(allennlp_dir / "options.json", tmp_path / "nope.hdf5")


def test_bad_native(fixture_model, tmp_path):
    fixture_model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ElmoError, match="model.safetensors: cannot read"):
        BiLM.from_pretrained(tmp_path)


@pytest.mark.core
def test_unknown_model_name():
    with pytest.raises(ElmoError, match="not a published model name"):
        BiLM.from_pretrained("no-such-model")


# -- downloads against a local HTTP server ---------------------------------------------------------
@pytest.fixture()
def http_server(allennlp_dir):
    handler = functools.partial(_QuietHandler, directory=str(allennlp_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests_seen: list[str] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        _QuietHandler.requests_seen.append(self.path)
        super().do_GET()


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_download_cache_offline_checksum(http_server, allennlp_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ELMO_OFFLINE", raising=False)
    url = f"{http_server}/lm_weights.hdf5"
    want = _sha(allennlp_dir / "lm_weights.hdf5")
    _QuietHandler.requests_seen.clear()
    p = W.cached_path(url, sha256=want)
    assert p.read_bytes() == (allennlp_dir / "lm_weights.hdf5").read_bytes()
    assert W.cached_path(url, sha256=want) == p  # second time: from the cache, no request
    assert _QuietHandler.requests_seen == ["/lm_weights.hdf5"]
    monkeypatch.setenv("ELMO_OFFLINE", "1")
    assert W.cached_path(url) == p  # offline, cached: fine
    with pytest.raises(ElmoError, match="not in the cache .* offline"):
        W.cached_path(f"{http_server}/options.json")
    monkeypatch.delenv("ELMO_OFFLINE")
    with pytest.raises(ElmoError, match="checksum mismatch"):
        W.cached_path(f"{http_server}/options.json", sha256="0" * 64)
    assert not any("options.json" in f.name for f in (tmp_path / "cache").iterdir())  # nothing half-written
    with pytest.raises(ElmoError, match="download failed"):
        W.cached_path(f"{http_server}/missing.hdf5")
    # A corrupted cache entry is detected by its recorded digest and fetched again.
    p.write_bytes(b"corrupt")
    assert W.cached_path(url).read_bytes() == (allennlp_dir / "lm_weights.hdf5").read_bytes()


def test_registry_names_resolve_via_download(http_server, allennlp_dir, tmp_path, monkeypatch,
                                             fixture_model):
    monkeypatch.setenv("ELMO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ELMO_OFFLINE", raising=False)
    name = "2x1024_128_2048cnn_1xhighway"
    assert set(R.REGISTRY) == {"2x1024_128_2048cnn_1xhighway", "2x2048_256_2048cnn_1xhighway",
                               "2x4096_512_2048cnn_2xhighway", "2x4096_512_2048cnn_2xhighway_5.5B"}
    assert R.REGISTRY[name]["weights"].endswith(f"/{name}/elmo_{name}_weights.hdf5")
    monkeypatch.setitem(R.REGISTRY, name, {
        "options": f"{http_server}/options.json", "weights": f"{http_server}/lm_weights.hdf5",
        "options_sha256": _sha(allennlp_dir / "options.json"),
        "weights_sha256": _sha(allennlp_dir / "lm_weights.hdf5")})
    model = BiLM.from_pretrained("small")  # alias of the registry name
    for a, b in zip(_outputs(model), _outputs(fixture_model)):
        assert torch.equal(a, b)
    monkeypatch.setenv("ELMO_OFFLINE", "1")
    BiLM.from_pretrained(name)  # cached now: works offline
    model = BiLM.from_published(f"{http_server}/options.json", f"{http_server}/lm_weights.hdf5")
    assert model.config == fixture_model.config
