"""Every variant recipe trains on synthetic data without NaN and its loss falls (short runs)."""

import pytest

from sanlab.experiments.smoke import recipes, smoke_train


@pytest.mark.slow
@pytest.mark.parametrize("recipe", recipes(), ids=lambda p: p.stem)
def test_variant_recipe_trains(recipe, tmp_path_factory):
    work = tmp_path_factory.getbasetemp() / "variant-smoke"
    work.mkdir(exist_ok=True)
    result = smoke_train(recipe, work=work, steps=40)
    assert result.finite, f"{recipe.name}: non-finite training loss"
    assert result.last_loss < result.first_loss, f"{recipe.name}: loss did not fall ({result})"
