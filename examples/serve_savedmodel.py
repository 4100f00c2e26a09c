"""Serve an exported model: load the SavedModel in a fresh process and call its Monte Carlo signature.

``tfdpbnn.export_saved_model`` writes a SavedModel with two signatures, ``serving_default`` (deterministic
prediction) and ``mc_predict`` (Monte Carlo summaries: predictive mean, predictive entropy, and its split
into expected entropy, aleatoric, and mutual information, epistemic; Depeweg et al. 2018), plus
``assets/privacy.json`` (the privacy statement) and ``assets/mc_predict.json`` (the default number of
samples). A serving process needs only TensorFlow: this script does not import tfdpbnn. It reads the privacy
record, calls both signatures on a batch of requests as TF Serving or any other client would, and, when the
requests file holds the exporting process's own predictions, compares them::

    python examples/dpvd_digits.py                                      # writes dpvd_digits/ and requests
    python examples/serve_savedmodel.py dpvd_digits --inputs dpvd_digits-requests.npz

``--inputs`` is a ``.npy`` array of inputs or an ``.npz`` file with ``x`` (and optionally ``deterministic``
and ``mc_mean``, the exporting process's outputs, as ``dpvd_digits.py`` and ``binary_tabular.py`` write).
``--fast`` (or ``TFDPBNN_EXAMPLES_FAST=1``) uses 20 Monte Carlo samples instead of the exported default.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf

# The privacy.json format versions this script reads (tfdpbnn.export.PRIVACY_FORMAT_VERSION; files without
# "format_version" predate it and have the same fields). It does not import tfdpbnn, so it keeps its own list.
PRIVACY_FORMAT_VERSIONS = (0, 1)


def read_privacy(export_dir):
    """The privacy statement written beside the model (strict JSON; an infinite epsilon is null + a flag).

    Exits with a message naming the fix when the file is of a format version this script does not know.
    """
    path = os.path.join(export_dir, "assets", "privacy.json")
    with open(path, encoding="utf-8") as fh:
        privacy = json.load(fh)
    version = privacy.get("format_version", 0)
    if version not in PRIVACY_FORMAT_VERSIONS or isinstance(version, bool | float):
        known = ", ".join(map(str, PRIVACY_FORMAT_VERSIONS))
        sys.exit(f"{path}: format_version {version!r} is not one this script reads ({known}); it was "
                 "written by a newer tfdpbnn: use the serve_savedmodel.py of that release")
    return privacy


def describe_privacy(privacy):
    """The privacy record in a few lines: epsilon, delta, training and assertions, or why there is none."""
    if "no_record" in privacy:   # weights of which nothing is known: no epsilon is claimed
        return f"no privacy guarantee: {privacy['no_record']}"
    epsilon = "infinite (no privacy)" if privacy.get("epsilon_is_infinite") else f"{privacy['epsilon']:.4f}"
    # A model exported without a DP optimizer: its statement is the record's, with no optimizer named.
    trainer = (f"{privacy['optimizer']} ({privacy['method']})" if privacy.get("optimizer")
               else "the DP training its privacy record holds")
    examples = f" on {privacy['num_examples']} examples" if privacy.get("num_examples") else ""
    text = (f"model trained with {trainer}: epsilon {epsilon} at delta {privacy['delta']:g} by the "
            f"{privacy['accountant']} accountant, {privacy['steps']} steps{examples}; asserted by the user: "
            f"{privacy['asserted_by_user'] or 'nothing'}")
    if privacy.get("guarantee") is False:   # e.g. noise replayable from a debug seed
        text += "\n" + privacy["guarantee_reason"]
    return text


def main():
    """Load the SavedModel, print its privacy record and serve the requests through both signatures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", help="directory written by tfdpbnn.export_saved_model")
    parser.add_argument("--inputs", required=True, help=".npy inputs, or .npz with x (see the docstring)")
    parser.add_argument("--num-samples", type=int, default=None, help="MC samples (default: the export's)")
    parser.add_argument("--fast", action="store_true", help="20 MC samples")
    args = parser.parse_args()
    fast = args.fast or os.environ.get("TFDPBNN_EXAMPLES_FAST") == "1"

    privacy = read_privacy(args.export_dir)
    with open(os.path.join(args.export_dir, "assets", "mc_predict.json"), encoding="utf-8") as fh:
        mc_config = json.load(fh)
    print(describe_privacy(privacy))

    num_samples = args.num_samples or (20 if fast else mc_config["default_num_samples"])
    requests = dict(np.load(args.inputs)) if args.inputs.endswith(".npz") else {"x": np.load(args.inputs)}
    x = tf.constant(requests["x"], tf.float32)

    served = tf.saved_model.load(args.export_dir)
    deterministic = served.signatures["serving_default"](x=x)["output"].numpy()
    out = served.signatures["mc_predict"](x=x, num_samples=tf.constant(num_samples, tf.int32))
    out = {name: value.numpy() for name, value in out.items()}
    mean = out["mean"]
    print(f"{len(mean)} requests, {num_samples} MC samples: predicted classes {mean.argmax(axis=1)[:10]}...")
    print(f"mean predictive entropy {out['predictive_entropy'].mean():.3f} = expected entropy (aleatoric) "
          f"{out['expected_entropy'].mean():.3f} + mutual information (epistemic) "
          f"{out['mutual_information'].mean():.4f}")

    summary = {"num_requests": len(mean), "num_samples": num_samples, "epsilon": privacy.get("epsilon"),
               "delta": privacy.get("delta"), "tfdpbnn_imported": "tfdpbnn" in sys.modules,
               "prob_min": float(mean.min()), "prob_max": float(mean.max()),
               "max_row_sum_error": float(np.abs(mean.sum(axis=1) - 1).max()),
               "max_entropy_split_error": float(np.abs(out["predictive_entropy"] - out["expected_entropy"]
                                                       - out["mutual_information"]).max()),
               "min_mutual_information": float(out["mutual_information"].min())}
    if "deterministic" in requests:
        difference = np.abs(deterministic - requests["deterministic"])
        summary["max_deterministic_difference"] = float(difference.max())
        print(f"deterministic outputs agree with the exporting process within "
              f"{summary['max_deterministic_difference']:.2e}")
    if "mc_mean" in requests:
        summary["mean_mc_difference"] = float(np.abs(mean - requests["mc_mean"]).mean())
        print(f"MC means differ from the exporting process's by {summary['mean_mc_difference']:.3f} on "
              f"average (independent Monte Carlo draws)")
    print("summary:", json.dumps(summary))


if __name__ == "__main__":
    main()
