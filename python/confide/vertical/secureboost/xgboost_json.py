"""A SecureBoost guest's trees in XGBoost's JSON model format, when every split is the guest's.

XGBoost loads the result (``xgboost.Booster(model_file=...)``) and scores the guest's prepared
features (float32, in the order of the guest's model file) as the federated model does: a row
goes left where ``x < threshold``, the trees' leaf weights (learning rate included) add to the
base margin, and the objective's link turns the margin into a score. A tree that splits on a
host's feature cannot be written: the guest holds only a record id there (the host keeps the
feature and the threshold), so the export is refused, saying how many such splits there are.
Binary logistic, squared-error regression and multi-class (softprob: one tree per class and round)
models export.
"""

from __future__ import annotations

import math

from confide.errors import InvalidParameterError
from confide.vertical.secureboost.tree import SecureBoostGuestModel

__all__ = ["XGBOOST_FORMAT_VERSION", "guest_trees_json"]

#: The XGBoost release whose JSON schema this writes (loads in XGBoost 2.0 and later).
XGBOOST_FORMAT_VERSION = [2, 0, 0]
_NO_PARENT = 2147483647


def guest_trees_json(model: SecureBoostGuestModel, feature_names: list[str]) -> dict:
    """The model as XGBoost's JSON document; raises InvalidParameterError where a split is a host's."""
    objective = model.params.objective
    if objective not in ("binary:logistic", "reg:squarederror", "multi:softprob"):
        raise InvalidParameterError(
            f"objective {objective}: SecureBoost models of binary:logistic, reg:squarederror and multi:softprob "
            "export to XGBoost's format"
        )
    hosts = sum(1 for tree in model.trees for node in tree if node.owner is not None and node.owner >= 0)
    if hosts:
        raise InvalidParameterError(
            f"{hosts} split(s) of the model are on hosts' features ({', '.join(model.hosts)}): the guest holds "
            "only a record id there, the host the feature and threshold, so XGBoost's format cannot hold these "
            "trees; score them with a scoring job (docs/vertical.md#scoring-new-records)"
        )
    if len(feature_names) != model.guest_features:
        raise InvalidParameterError(
            f"{len(feature_names)} feature names for a model of {model.guest_features} guest features"
        )
    trees = [_tree(index, tree, model.guest_features) for index, tree in enumerate(model.trees)]
    classes = model.params.num_class if objective == "multi:softprob" else 1
    margin = model.base_margin
    # XGBoost keeps the base score in the objective's output space and applies the link to it
    # (softmax's is the identity: one margin per class).
    base = 1.0 / (1.0 + math.exp(-margin)) if objective == "binary:logistic" else margin
    base_score = "[" + ",".join([f"{base:.9E}"] * classes) + "]"
    objective_section: dict = {"name": objective}
    if classes > 1:
        objective_section["softmax_multiclass_param"] = {"num_class": str(classes)}
    else:
        objective_section["reg_loss_param"] = {"scale_pos_weight": "1"}
    return {
        "learner": {
            "attributes": {},
            "feature_names": list(feature_names),
            "feature_types": ["float"] * len(feature_names),
            "gradient_booster": {
                "model": {
                    "gbtree_model_param": {"num_parallel_tree": "1", "num_trees": str(len(trees))},
                    "iteration_indptr": list(range(0, len(trees) + 1, classes)),
                    "tree_info": [index % classes for index in range(len(trees))],
                    "trees": trees,
                },
                "name": "gbtree",
            },
            "learner_model_param": {
                "base_score": base_score,
                "boost_from_average": "1",
                "num_class": str(classes if classes > 1 else 0),
                "num_feature": str(len(feature_names)),
                "num_target": "1",
            },
            "objective": objective_section,
        },
        "version": list(XGBOOST_FORMAT_VERSION),
    }


def _tree(index: int, nodes, features: int) -> dict:
    """One tree in XGBoost's array layout: the root first, then the other nodes in their order."""
    nodes = sorted(nodes, key=lambda node: node.depth != 0)
    position = {node.id: i for i, node in enumerate(nodes)}
    count = len(nodes)
    left, right, parents = [-1] * count, [-1] * count, [_NO_PARENT] * count
    conditions, indices, gains, weights = [0.0] * count, [0] * count, [0.0] * count, [0.0] * count
    for i, node in enumerate(nodes):
        if node.owner is None:  # a leaf: XGBoost keeps its weight as the split condition
            conditions[i] = weights[i] = float(node.weight)
            continue
        left[i], right[i] = position[node.left], position[node.right]
        parents[left[i]] = parents[right[i]] = i
        conditions[i], indices[i], gains[i] = float(node.threshold), int(node.feature), float(node.gain)
    return {
        "base_weights": weights,
        "categories": [],
        "categories_nodes": [],
        "categories_segments": [],
        "categories_sizes": [],
        "default_left": [0] * count,
        "id": index,
        "left_children": left,
        "loss_changes": gains,
        "parents": parents,
        "right_children": right,
        "split_conditions": conditions,
        "split_indices": indices,
        "split_type": [0] * count,
        "sum_hessian": [0.0] * count,
        "tree_param": {
            "num_deleted": "0",
            "num_feature": str(features),
            "num_nodes": str(count),
            "size_leaf_vector": "1",
        },
    }
