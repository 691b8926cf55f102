"""Built-in skill libraries that follow each game's tech tree.

Dependencies come from the crafting requirements: a pickaxe needs a table (which needs wood), stone
needs a wood pickaxe, iron a stone pickaxe plus coal and a furnace for the iron tools, and so on.
Success is the game's own achievement flag, so "done" means what the game means by it. The
TechTree-v0 library adds two count skills (`collect_three_wood`, `collect_two_stone`) that branch off
the chain, so that the scheduler has independent skills to train side by side in fast tests.
"""

from __future__ import annotations

from jaxrl_hier.config import closest
from jaxrl_hier.skills.spec import Condition, Skill, SkillError, SkillLibrary


def _achievement(name: str, requires: tuple[str, ...] = (), description: str = "") -> Skill:
    return Skill(name, requires, (Condition(f"achievement.{name}", "==", 1.0),), description=description)


def techtree_library() -> SkillLibrary:
    a = _achievement
    return SkillLibrary((
        a("collect_wood", (), "hit a tree"),
        a("place_table", ("collect_wood",), "place a table (1 wood)"),
        Skill("collect_three_wood", ("collect_wood",), (Condition("inventory.wood", ">=", 3.0),),
              description="hold three wood at once"),
        a("make_wood_pickaxe", ("place_table",), "craft at a table (1 wood)"),
        a("collect_stone", ("make_wood_pickaxe",), "mine stone with a wood pickaxe"),
        Skill("collect_two_stone", ("collect_stone",), (Condition("inventory.stone", ">=", 2.0),),
              description="hold two stone at once"),
        a("make_stone_pickaxe", ("collect_stone",), "craft at a table (wood + stone)"),
        a("collect_iron", ("make_stone_pickaxe",), "mine iron with a stone pickaxe"),
        a("make_iron_pickaxe", ("collect_iron",), "craft at a table (wood + stone + iron)"),
        a("collect_diamond", ("make_iron_pickaxe",), "mine the diamond with an iron pickaxe"),
    ))


# The tech tree shared by Craftax-Classic and the first floor of Craftax.
_CLASSIC_TREE: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("collect_wood", (), "punch a tree"),
    ("place_table", ("collect_wood",), "place a crafting table (wood)"),
    ("make_wood_pickaxe", ("place_table",), "at a table, with wood"),
    ("make_wood_sword", ("place_table",), "at a table, with wood"),
    ("collect_stone", ("make_wood_pickaxe",), "mine stone (wood pickaxe)"),
    ("place_stone", ("collect_stone",), "place a stone block"),
    ("make_stone_pickaxe", ("collect_stone",), "at a table, with wood and stone"),
    ("make_stone_sword", ("collect_stone",), "at a table, with wood and stone"),
    ("place_furnace", ("collect_stone",), "place a furnace next to a table (stone)"),
    ("collect_coal", ("make_wood_pickaxe",), "mine coal (wood pickaxe)"),
    ("collect_iron", ("make_stone_pickaxe",), "mine iron (stone pickaxe)"),
    ("make_iron_pickaxe", ("collect_iron", "collect_coal", "place_furnace"),
     "at a table and furnace, with wood, coal and iron"),
    ("make_iron_sword", ("collect_iron", "collect_coal", "place_furnace"),
     "at a table and furnace, with wood, coal and iron"),
    ("collect_diamond", ("make_iron_pickaxe",), "mine a diamond (iron pickaxe)"),
    ("collect_sapling", (), "collect a sapling from grass"),
    ("place_plant", ("collect_sapling",), "plant a sapling"),
    ("eat_plant", ("place_plant",), "eat a ripe plant"),
    ("collect_drink", (), "drink water"),
    ("eat_cow", (), "hit a cow until it is eaten"),
    ("defeat_zombie", (), "defeat a zombie"),
    ("defeat_skeleton", (), "defeat a skeleton in a cave"),
    ("wake_up", (), "sleep and wake up"),
)

# Craftax (full game) additions, with their crafting requirements.
_FULL_EXTRA: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("make_arrow", ("collect_wood", "collect_stone"), "at a table, with wood and stone"),
    ("make_torch", ("collect_wood", "collect_coal"), "at a table, with wood and coal"),
    ("place_torch", ("make_torch",), "place a torch"),
    ("make_iron_armour", ("collect_iron", "collect_coal", "place_furnace"), "at a table and furnace"),
    ("make_diamond_pickaxe", ("collect_diamond",), "at a table and furnace, with diamonds"),
    ("make_diamond_sword", ("collect_diamond",), "at a table and furnace, with diamonds"),
    ("enter_dungeon", (), "take the ladder down to the dungeon (floor 1)"),
    ("enter_gnomish_mines", ("enter_dungeon",), "go down to the gnomish mines (floor 2)"),
    ("collect_sapphire", ("make_iron_pickaxe",), "mine a sapphire (iron pickaxe)"),
    ("collect_ruby", ("make_iron_pickaxe",), "mine a ruby (iron pickaxe)"),
)


def craftax_classic_library() -> SkillLibrary:
    return SkillLibrary(tuple(_achievement(n, r, d) for n, r, d in _CLASSIC_TREE))


def craftax_library() -> SkillLibrary:
    return SkillLibrary(tuple(_achievement(n, r, d) for n, r, d in _CLASSIC_TREE + _FULL_EXTRA))


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
