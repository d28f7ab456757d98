"""python3 -m unittest scripts.bench.test_targets: targets.toml against the run of record, no server."""
import unittest

from . import results, targets


class Targets(unittest.TestCase):
    def test_every_target_names_a_figure_of_the_run_of_record(self):
        data = results.load_flat()
        missing = [t["measure"] for t in targets.load() if not isinstance(data.get(t["measure"]), (int, float))]
        self.assertEqual(missing, [])

    def test_a_missing_figure_fails_its_target(self):
        target = dict(name="n", measure="no.such.key", comparison="<=", limit=1.0, source="s")
        self.assertEqual(targets.check([target], {}), [(target, None, False)])

    def test_comparisons(self):
        def passes(comparison, value):
            target = dict(name="n", measure="k", comparison=comparison, limit=1.25, source="s")
            return targets.check([target], {"k": value})[0][2]

        self.assertTrue(passes("<=", 1.25))
        self.assertFalse(passes("<=", 1.26))
        self.assertTrue(passes(">=", 1.25))
        self.assertFalse(passes("<", 1.25))


if __name__ == "__main__":
    unittest.main()
