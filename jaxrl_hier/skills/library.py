"""Built-in skill libraries that follow each game's tech tree.

Dependencies come from the crafting requirements: a craft requires the skills that give it what it
spends (a wood pickaxe: a table and wood; an iron pickaxe: wood, stone, coal, iron and a furnace),
and the chain of tools below (stone needs a wood pickaxe, iron a stone pickaxe). Crafting and
placing skills succeed on the game's own achievement flag, so "done" means what the game means by
it. Material skills (`collect_wood`, `collect_stone`, `collect_coal`, `collect_iron`,
`collect_sapling`) succeed while the inventory holds one: a craft spends it, and routing
(`skills.env.route`) hands control back to the skill that gathers it before the next craft that
directly requires it, and only then. With the achievement flag instead, the next craft's own
expert had to gather its materials itself (on TechTree, make_iron_pickaxe's expert took control
with no wood and no stone, and never learned from fresh worlds). The TechTree-v0 library adds two
count skills (`collect_three_wood`, `collect_two_stone`) that branch off the chain, so that the
scheduler has independent skills to train side by side in fast tests.
"""

from __future__ import annotations

from jaxrl_hier.config import closest
from jaxrl_hier.skills.spec import Condition, Skill, SkillError, SkillLibrary


def _achievement(name: str, requires: tuple[str, ...] = (), description: str = "") -> Skill:
    return Skill(name, requires, (Condition(f"achievement.{name}", "==", 1.0),), description=description)


def _holding(name: str, item: str, requires: tuple[str, ...] = (), description: str = "") -> Skill:
    """A material skill: it holds while the inventory has one `item` (see the module docstring)."""
    return Skill(name, requires, (Condition(f"inventory.{item}", ">=", 1.0),), description=description)


def techtree_library() -> SkillLibrary:
    a, h = _achievement, _holding
    return SkillLibrary((
        h("collect_wood", "wood", (), "hit a tree (hold one wood)"),
        a("place_table", ("collect_wood",), "place a table (1 wood)"),
        Skill("collect_three_wood", ("collect_wood",), (Condition("inventory.wood", ">=", 3.0),),
              description="hold three wood at once"),
        a("make_wood_pickaxe", ("place_table", "collect_wood"), "craft at a table (1 wood)"),
        h("collect_stone", "stone", ("make_wood_pickaxe",), "mine stone with a wood pickaxe (hold one stone)"),
        Skill("collect_two_stone", ("collect_stone",), (Condition("inventory.stone", ">=", 2.0),),
              description="hold two stone at once"),
        a("make_stone_pickaxe", ("collect_stone", "collect_wood"), "craft at a table (wood + stone)"),
        h("collect_iron", "iron", ("make_stone_pickaxe",), "mine iron with a stone pickaxe (hold one iron)"),
        a("make_iron_pickaxe", ("collect_iron", "collect_stone", "collect_wood"), "craft at a table (wood + stone + iron)"),
        a("collect_diamond", ("make_iron_pickaxe",), "mine the diamond with an iron pickaxe"),
    ))


# The tech tree shared by Craftax-Classic and the first floor of Craftax: (name, material item or
# None for an achievement skill, requires, description).
_CLASSIC_TREE: tuple[tuple[str, str | None, tuple[str, ...], str], ...] = (
    ("collect_wood", "wood", (), "punch a tree (hold one wood)"),
    ("place_table", None, ("collect_wood",), "place a crafting table (wood)"),
    ("make_wood_pickaxe", None, ("place_table", "collect_wood"), "at a table, with wood"),
    ("make_wood_sword", None, ("place_table", "collect_wood"), "at a table, with wood"),
    ("collect_stone", "stone", ("make_wood_pickaxe",), "mine stone (wood pickaxe; hold one stone)"),
    ("place_stone", None, ("collect_stone",), "place a stone block"),
    ("make_stone_pickaxe", None, ("collect_stone", "collect_wood"), "at a table, with wood and stone"),
    ("make_stone_sword", None, ("collect_stone", "collect_wood"), "at a table, with wood and stone"),
    ("place_furnace", None, ("collect_stone",), "place a furnace next to a table (stone)"),
    ("collect_coal", "coal", ("make_wood_pickaxe",), "mine coal (wood pickaxe; hold one coal)"),
    ("collect_iron", "iron", ("make_stone_pickaxe",), "mine iron (stone pickaxe; hold one iron)"),
    ("make_iron_pickaxe", None, ("collect_iron", "collect_coal", "place_furnace", "collect_stone", "collect_wood"),
     "at a table and furnace, with wood, stone, coal and iron"),
    ("make_iron_sword", None, ("collect_iron", "collect_coal", "place_furnace", "collect_stone", "collect_wood"),
     "at a table and furnace, with wood, stone, coal and iron"),
    ("collect_diamond", None, ("make_iron_pickaxe",), "mine a diamond (iron pickaxe)"),
    ("collect_sapling", "sapling", (), "collect a sapling from grass (hold one)"),
    ("place_plant", None, ("collect_sapling",), "plant a sapling"),
    ("eat_plant", None, ("place_plant",), "eat a ripe plant"),
    ("collect_drink", None, (), "drink water"),
    ("eat_cow", None, (), "hit a cow until it is eaten"),
    ("defeat_zombie", None, (), "defeat a zombie"),
    ("defeat_skeleton", None, (), "defeat a skeleton in a cave"),
    ("wake_up", None, (), "sleep and wake up"),
)

# Craftax (full game) additions, with their crafting requirements.
_FULL_EXTRA: tuple[tuple[str, str | None, tuple[str, ...], str], ...] = (
    ("make_arrow", None, ("collect_wood", "collect_stone"), "at a table, with wood and stone"),
    ("make_torch", None, ("collect_wood", "collect_coal"), "at a table, with wood and coal"),
    ("place_torch", None, ("make_torch",), "place a torch"),
    ("make_iron_armour", None, ("collect_iron", "collect_coal", "place_furnace"), "at a table and furnace"),
    ("make_diamond_pickaxe", None, ("collect_diamond",), "at a table and furnace, with diamonds"),
    ("make_diamond_sword", None, ("collect_diamond",), "at a table and furnace, with diamonds"),
    ("enter_dungeon", None, (), "take the ladder down to the dungeon (floor 1)"),
    ("enter_gnomish_mines", None, ("enter_dungeon",), "go down to the gnomish mines (floor 2)"),
    ("collect_sapphire", None, ("make_iron_pickaxe",), "mine a sapphire (iron pickaxe)"),
    ("collect_ruby", None, ("make_iron_pickaxe",), "mine a ruby (iron pickaxe)"),
)


def _tree(rows) -> SkillLibrary:
    return SkillLibrary(tuple(_holding(n, item, r, d) if item else _achievement(n, r, d) for n, item, r, d in rows))


def craftax_classic_library() -> SkillLibrary:
    return _tree(_CLASSIC_TREE)


def craftax_library() -> SkillLibrary:
    return _tree(_CLASSIC_TREE + _FULL_EXTRA)


BUILTIN_LIBRARIES = {"techtree": techtree_library, "craftax_classic": craftax_classic_library,
                     "craftax": craftax_library}


def builtin_library(name: str) -> SkillLibrary:
    if name not in BUILTIN_LIBRARIES:
        raise SkillError(f"unknown built-in skill library '{name}'.{closest(name, list(BUILTIN_LIBRARIES))} "
                         f"Built-in libraries: {', '.join(BUILTIN_LIBRARIES)}; or give a path to a YAML file.")
    return BUILTIN_LIBRARIES[name]()


def default_library_for(env_name: str) -> str:
    """The built-in library that matches an env name."""
    if env_name.startswith("TechTree"):
        return "techtree"
    if env_name.startswith("Craftax-Classic"):
        return "craftax_classic"
    if env_name.startswith("Craftax"):
        return "craftax"
    raise SkillError(f"no built-in skill library for env '{env_name}'; set 'library' to a YAML file of skills.")
