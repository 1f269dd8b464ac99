"""The installed environment: one provider per module, pip check, a quiet import."""
import importlib.metadata
import subprocess
import sys


def test_exactly_one_distribution_provides_seqio_and_tfds():
    providers = importlib.metadata.packages_distributions()
    assert providers["seqio"] == ["seqio-nightly"]
    assert providers["tensorflow_datasets"] == ["tfds-nightly"]


def test_pip_check_passes():
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_is_quiet_and_hides_accelerators_from_tensorflow():
    code = (
        "import t5nb, seqio, t5, tensorflow_datasets, clu.metric_writers\n"
        "import tensorflow as tf\n"
        "print(tf.config.get_visible_devices('GPU'), tf.config.get_visible_devices('TPU'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] []"
    for noise in ("cudart_stub", "cuInit", "absl::InitializeLog", "TensorInfo.dtype"):
        assert noise not in result.stderr, result.stderr
