"""TechTree-v0: a small crafting gridworld with a tech tree, for fast tests and skills.

The player walks on a small grid with trees, stone, iron and a diamond. `do` mines the best
adjacent tile it can: trees always (they stay), stone with a wood pickaxe, iron with a stone
pickaxe, the diamond with an iron pickaxe (mined tiles become grass). A table is placed from one
wood; next to a table the pickaxes are crafted (wood; wood + stone; wood + stone + iron).
Each achievement gives +1 reward the first time it is unlocked, as in Craftax. Episodes end
only by the time limit (a truncation). The whole tree is 8 achievements deep and fits in the
default 100 steps, so the bottom-up skills code can learn it skill by skill on a CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_hier.envs.base import Environment
from jaxrl_hier.envs.spaces import Box, Discrete

ITEMS = ("wood", "stone", "iron", "diamond", "wood_pickaxe", "stone_pickaxe", "iron_pickaxe")
ACHIEVEMENTS = ("collect_wood", "place_table", "make_wood_pickaxe", "collect_stone", "make_stone_pickaxe",
                "collect_iron", "make_iron_pickaxe", "collect_diamond")
ACTIONS = ("noop", "up", "down", "left", "right", "do", "place_table", "make_wood_pickaxe",
           "make_stone_pickaxe", "make_iron_pickaxe")
TILES = ("grass", "tree", "stone", "iron", "diamond", "table")
GRASS, TREE, STONE, IRON, DIAMOND, TABLE = range(len(TILES))
WOOD_I, STONE_I, IRON_I, DIAMOND_I, WPICK_I, SPICK_I, IPICK_I = range(len(ITEMS))
MOVES = jnp.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], jnp.int32)
NEIGHBOURS = jnp.array([[-1, 0], [1, 0], [0, -1], [0, 1]], jnp.int32)


@struct.dataclass
class TechTreeParams:
    size: int = struct.field(pytree_node=False, default=7)
    max_steps: int = 100
    num_trees: int = struct.field(pytree_node=False, default=5)
    num_stone: int = struct.field(pytree_node=False, default=4)
    num_iron: int = struct.field(pytree_node=False, default=2)
    num_diamonds: int = struct.field(pytree_node=False, default=1)
    # Egocentric view: the map as seen from the player (a (2 size - 1)^2 window centred on it, cells
    # off the map in their own channel), as Craftax's local view. A policy learns "walk to the
    # nearest tree" from it far faster than from a global map plus a position plane.
    egocentric: bool = struct.field(pytree_node=False, default=True)


@struct.dataclass
class TechTreeState:
    pos: jax.Array  # int32[2]
    grid: jax.Array  # int32[H, W]
    inventory: jax.Array  # int32[len(ITEMS)]
    achievements: jax.Array  # bool[len(ACHIEVEMENTS)]
    timestep: jax.Array  # int32


# RGB of each tile when drawn (`render`), then the player and cells off the map.
TILE_COLOURS = ((96, 168, 72), (30, 90, 30), (128, 128, 128), (200, 140, 90), (120, 230, 240), (150, 100, 50))
PLAYER_COLOUR = (240, 60, 60)
CELL_PX = 16


class TechTree(Environment):
    name = "TechTree-v0"
    achievement_names = ACHIEVEMENTS
    achievement_rewards = (1.0,) * len(ACHIEVEMENTS)  # +1 the first time each is unlocked
    item_names = ITEMS
    action_names = ACTIONS

    @property
    def default_params(self) -> TechTreeParams:
        return TechTreeParams()

    def reset(self, key, params):
        n = params.size * params.size
        cells = jax.random.permutation(key, n)
        counts = [(TREE, params.num_trees), (STONE, params.num_stone), (IRON, params.num_iron),
                  (DIAMOND, params.num_diamonds)]
        tiles = jnp.full((n,), GRASS, jnp.int32)
        start = 1  # cells[0] is where the player starts
        for tile, count in counts:
            tiles = tiles.at[cells[start:start + count]].set(tile)
            start += count
        grid = tiles.reshape(params.size, params.size)
        pos = jnp.stack([cells[0] // params.size, cells[0] % params.size]).astype(jnp.int32)
        state = TechTreeState(pos, grid, jnp.zeros(len(ITEMS), jnp.int32), jnp.zeros(len(ACHIEVEMENTS), bool),
                              jnp.int32(0))
        return self._obs(state, params), state

    def _neighbour_tiles(self, state, params):
        cells = state.pos[None] + NEIGHBOURS
        inside = jnp.all((cells >= 0) & (cells < params.size), axis=1)
        clipped = jnp.clip(cells, 0, params.size - 1)
        return clipped, jnp.where(inside, state.grid[clipped[:, 0], clipped[:, 1]], -1)

    def step(self, key, state, action, params):
        inv = state.inventory
        cells, tiles = self._neighbour_tiles(state, params)

        # Movement onto grass only.
        target = jnp.clip(state.pos + MOVES[jnp.clip(action, 0, 4)], 0, params.size - 1)
        walkable = state.grid[target[0], target[1]] == GRASS
        pos = jnp.where((action >= 1) & (action <= 4) & walkable, target, state.pos)

        # `do`: mine the best adjacent tile the inventory allows.
        can = {TREE: True, STONE: inv[WPICK_I] > 0, IRON: inv[SPICK_I] > 0, DIAMOND: inv[IPICK_I] > 0}
        grid, gained, mined = state.grid, jnp.zeros_like(inv), jnp.bool_(False)
        for tile, item in ((DIAMOND, DIAMOND_I), (IRON, IRON_I), (STONE, STONE_I), (TREE, WOOD_I)):
            hit = (tiles == tile) & can[tile]
            take = (action == 5) & hit.any() & ~mined
            cell = cells[jnp.argmax(hit)]
            new_tile = TREE if tile == TREE else GRASS  # trees regrow at once
            grid = jnp.where(take, grid.at[cell[0], cell[1]].set(new_tile), grid)
            gained = gained.at[item].add(take.astype(jnp.int32))
            mined = mined | take
        inv = inv + gained

        # Place a table on an adjacent grass tile.
        free = tiles == GRASS
        place = (action == 6) & (inv[WOOD_I] >= 1) & free.any()
        cell = cells[jnp.argmax(free)]
        grid = jnp.where(place, grid.at[cell[0], cell[1]].set(TABLE), grid)
        inv = inv.at[WOOD_I].add(-place.astype(jnp.int32))

        # Craft next to a table (3x3 around the player).
        near = self._near_table(grid, pos)
        recipes = ((7, WPICK_I, (WOOD_I,)), (8, SPICK_I, (WOOD_I, STONE_I)), (9, IPICK_I, (WOOD_I, STONE_I, IRON_I)))
        crafted = {}
        for act, tool, needs in recipes:
            ok = (action == act) & near & jnp.all(jnp.stack([inv[i] >= 1 for i in needs]))
            for i in needs:
                inv = inv.at[i].add(-ok.astype(jnp.int32))
            inv = inv.at[tool].add(ok.astype(jnp.int32))
            crafted[tool] = ok

        unlocked = jnp.stack([
            gained[WOOD_I] > 0, place, crafted[WPICK_I], gained[STONE_I] > 0, crafted[SPICK_I],
            gained[IRON_I] > 0, crafted[IPICK_I], gained[DIAMOND_I] > 0,
        ])
        achievements = state.achievements | unlocked
        reward = (achievements.sum() - state.achievements.sum()).astype(jnp.float32)
        new = TechTreeState(pos, grid, inv, achievements, state.timestep + 1)
        truncated = new.timestep >= params.max_steps
        return self._obs(new, params), new, reward, jnp.bool_(False), truncated, {}

    def _near_table(self, grid, pos):
        padded = jnp.pad(grid == TABLE, 1)
        return jax.lax.dynamic_slice(padded, (pos[0], pos[1]), (3, 3)).any()

    def _obs(self, state, params):
        inv = jnp.minimum(state.inventory, 5).astype(jnp.float32) / 5.0
        if params.egocentric:
            n = params.size
            # Pad with an "outside" tile id, then cut the window whose centre is the player.
            padded = jnp.pad(state.grid, n - 1, constant_values=len(TILES))
            view = jax.lax.dynamic_slice(padded, (state.pos[0], state.pos[1]), (2 * n - 1, 2 * n - 1))
            return jnp.concatenate([jax.nn.one_hot(view, len(TILES) + 1, dtype=jnp.float32).reshape(-1), inv])
        grid = jax.nn.one_hot(state.grid, len(TILES), dtype=jnp.float32).reshape(-1)
        where = jnp.zeros((params.size, params.size), jnp.float32).at[state.pos[0], state.pos[1]].set(1.0).reshape(-1)
        return jnp.concatenate([grid, where, inv])

    def render(self, state, params):
        """An RGB frame [size * 16, size * 16, 3]: one coloured square per tile, the player in red."""
        colours = jnp.asarray(TILE_COLOURS, jnp.uint8)[state.grid]
        colours = colours.at[state.pos[0], state.pos[1]].set(jnp.asarray(PLAYER_COLOUR, jnp.uint8))
        return jnp.repeat(jnp.repeat(colours, CELL_PX, axis=0), CELL_PX, axis=1)

    def observation_space(self, params):
        if params.egocentric:
            dim = (2 * params.size - 1) ** 2 * (len(TILES) + 1) + len(ITEMS)
        else:
            dim = params.size * params.size * (len(TILES) + 1) + len(ITEMS)
        return Box(0.0, 1.0, (dim,), jnp.float32)

    def action_space(self, params):
        return Discrete(len(ACTIONS))

    def achievements(self, state):
        return state.achievements
