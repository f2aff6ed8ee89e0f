"""The category/attribute grammar behind the generated WebShop catalog.

Five top-level categories as in the official WebShop scrape (beauty, food, fashion,
furniture, electronics), each with product types. A product type carries its search
``query`` (the official files group products by the Amazon query that found them), its
Amazon-style ``product_category`` path, the nouns its titles use, a pool of attributes
(phrased like the official ``instruction_attributes``: "gluten free", "machine wash") and
its option dimensions (official ``customization_options``: "size", "color", "flavor name").

Option values are lower case, as the official loader stores them. Options named ``size``
are matched exactly by the reward; the others fuzzily.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProductType:
    """One kind of product: how it is searched for, named, described and customised."""

    query: str
    path: tuple[str, ...]
    nouns: tuple[str, ...]
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]
    uses: tuple[str, ...]


def _t(query, path, nouns, attributes, options, price, uses) -> ProductType:
    return ProductType(query, tuple(path), tuple(nouns), tuple(attributes),
                       tuple((k, tuple(v)) for k, v in options.items()), price, tuple(uses))


APPAREL_SIZES = ("x-small", "small", "medium", "large", "x-large", "xx-large", "3x-large")
SHOE_SIZES = ("6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12")
FASHION_COLORS = ("black", "white", "navy blue", "heather grey", "red", "olive green", "khaki", "burgundy",
                  "light pink", "royal blue", "charcoal", "beige", "dark brown", "mustard yellow", "teal")
HOME_COLORS = ("black", "white", "walnut", "natural oak", "espresso", "grey", "rustic brown", "navy blue",
               "cream", "sage green", "gold", "light grey")
TECH_COLORS = ("black", "white", "silver", "space grey", "rose gold", "midnight blue", "red", "clear",
               "forest green", "lavender")
SCENTS = ("lavender", "unscented", "fresh citrus", "coconut", "vanilla", "eucalyptus mint", "rose", "sandalwood",
          "ocean breeze", "cucumber melon")
FLAVORS = ("chocolate", "peanut butter", "vanilla", "salted caramel", "strawberry", "cookies and cream",
           "original", "honey", "sea salt", "mixed berry", "cinnamon", "spicy")
LIQUID_SIZES = ("1.7 fl oz (pack of 1)", "3.4 fl oz (pack of 1)", "8 fl oz (pack of 1)", "8 fl oz (pack of 2)",
                "16 fl oz (pack of 1)", "2 fl oz (pack of 3)")
FOOD_SIZES = ("12 count (pack of 1)", "12 count (pack of 2)", "24 count", "6 ounce (pack of 4)", "16 ounce",
              "2 pound (pack of 1)", "5.3 ounce (pack of 6)", "32 ounce")

BRANDS = {
    "beauty": ("Lumiere", "Botanica Bliss", "Pure Glow", "Velvet Grace", "Aurora Skin", "Nordic Dew", "Silk & Stone",
               "Honeybee Lab", "Mira Rose", "Evergreen Apothecary", "Luxe Curl", "Opaline"),
    "food": ("Harvest Lane", "Golden Acre", "Wild Pantry", "Sunny Orchard", "Mountain Roast", "Bay Leaf Co",
             "Nutri Crunch", "Prairie Mill", "Little Farm", "Copper Kettle", "Saltwind", "Green Basket"),
    "fashion": ("Northpeak", "Urban Thread", "Coastline", "Ivy & Oak", "Stride Lab", "Maple Row", "Redwood Supply",
                "Ember & Ash", "Tidal", "Fenwick", "Solstice", "Harbor Knit"),
    "furniture": ("Oakhaven", "Nestwell", "Loft & Line", "Hearthstone", "Birchwood Home", "Casa Verde", "Modhaus",
                  "Timber Lane", "Cozy Den", "Ashgrove", "Brightnook", "Stonebridge"),
    "electronics": ("Voltix", "Sonique", "Zentrek", "Aurapulse", "Kinetiq", "Novalink", "Pixelcore", "Ampere Labs",
                    "Tandem Audio", "Lumina Tech", "Orbix", "Quantix"),
}

CATEGORY_ROOTS = {
    "beauty": "Beauty & Personal Care",
    "food": "Grocery & Gourmet Food",
    "fashion": "Clothing, Shoes & Jewelry",
    "furniture": "Home & Kitchen",
    "electronics": "Electronics",
}

BEAUTY_ATTRS = ("paraben free", "cruelty free", "long lasting", "natural ingredients", "sensitive skin", "easy to use",
                "travel size", "alcohol free", "dry skin", "high quality", "sulfate free", "fragrance free")
FOOD_ATTRS = ("gluten free", "low calorie", "non gmo", "sugar free", "keto friendly", "high protein",
              "natural flavors", "individually wrapped", "ready to eat", "plant based", "dairy free", "usda organic")
FASHION_ATTRS = ("machine wash", "slim fit", "long sleeve", "short sleeve", "non slip", "quick drying", "daily wear",
                 "button closure", "elastic waistband", "rubber sole", "water resistant", "moisture wicking")
HOME_ATTRS = ("easy assembly", "living room", "solid wood", "space saving", "metal legs", "storage space",
              "easy clean", "high density", "lumbar support", "mid century", "dining room", "non slip")
_B = ("Beauty & Personal Care",)
_F = ("Grocery & Gourmet Food",)
_C = ("Clothing, Shoes & Jewelry",)
_H = ("Home & Kitchen",)
_E = ("Electronics",)

TYPES: dict[str, tuple[ProductType, ...]] = {
    "beauty": (
        _t("hair extensions", _B + ("Hair Care", "Hair Extensions, Wigs & Accessories", "Hair Extensions"),
           ("clip in hair extensions", "hair extension", "synthetic hairpiece"),
           BEAUTY_ATTRS[4:8] + ("natural looking", "heat resistant", "hair salon", "long hair"),
           {"color": ("jet black", "natural black", "dark brown", "ash blonde", "auburn", "honey blonde"),
            "size": ("14 inch", "18 inch", "20 inch", "22 inch", "24 inch")}, (9, 60), ("daily wear", "parties")),
        _t("deodorant", _B + ("Personal Care", "Deodorants & Antiperspirants", "Deodorant"),
           ("natural deodorant", "deodorant stick", "antiperspirant"),
           BEAUTY_ATTRS, {"scent": SCENTS, "size": ("2.6 ounce (pack of 1)", "2.6 ounce (pack of 2)",
                                                     "3 ounce (pack of 3)")}, (5, 30), ("gym days", "travel")),
        _t("face moisturizer", _B + ("Skin Care", "Face", "Creams & Moisturizers"),
           ("face moisturizer", "day cream", "hydrating face lotion"),
           BEAUTY_ATTRS + ("hyaluronic acid", "anti aging"), {"size": LIQUID_SIZES}, (8, 70),
           ("morning routine", "night care")),
        _t("shampoo", _B + ("Hair Care", "Shampoo & Conditioner", "Shampoos"),
           ("shampoo", "clarifying shampoo", "shampoo and conditioner set"),
           BEAUTY_ATTRS + ("hair growth", "color safe", "dry hair"), {"scent": SCENTS, "size": LIQUID_SIZES},
           (6, 45), ("daily washing", "curly hair")),
        _t("lipstick", _B + ("Makeup", "Lips", "Lipstick"), ("matte lipstick", "lip stain", "liquid lipstick"),
           BEAUTY_ATTRS[:8] + ("highly pigmented", "waterproof"),
           {"color": ("ruby red", "nude pink", "berry", "coral", "mauve", "deep plum", "brick red")}, (5, 35),
           ("everyday makeup", "evening looks")),
        _t("nail polish", _B + ("Foot, Hand & Nail Care", "Nail Art & Polish", "Nail Polish"),
           ("nail polish", "gel nail polish set", "nail lacquer"), BEAUTY_ATTRS[:8] + ("quick drying", "non toxic"),
           {"color": ("cherry red", "baby pink", "midnight black", "glitter gold", "pastel blue", "nude")},
           (4, 30), ("manicures", "nail salon")),
        _t("makeup brushes", _B + ("Tools & Accessories", "Makeup Brushes & Tools", "Brush Sets"),
           ("makeup brush set", "foundation brush", "blending brushes"),
           ("easy to use", "high quality", "travel size", "cruelty free", "synthetic hair", "easy clean",
            "storage case", "soft bristles"),
           {"color": ("rose gold", "black", "white", "champagne"), "size": ("5 pcs", "12 pcs", "16 pcs")}, (7, 40),
           ("foundation", "eye shadow")),
        _t("perfume", _B + ("Fragrance", "Women's", "Eau de Parfum"), ("eau de parfum", "perfume spray", "body mist"),
           BEAUTY_ATTRS[:8] + ("long lasting fragrance", "gift set"), {"scent": SCENTS, "size": LIQUID_SIZES[:3]},
           (15, 120), ("date nights", "gifts")),
    ),
    "food": (
        _t("protein bars", _F + ("Snack Foods", "Bars", "Protein Bars"), ("protein bars", "protein bar", "snack bars"),
           FOOD_ATTRS, {"flavor name": FLAVORS, "size": FOOD_SIZES[:3]}, (10, 45), ("breakfast", "workouts")),
        _t("coffee beans", _F + ("Beverages", "Coffee, Tea & Cocoa", "Coffee", "Whole Coffee Beans"),
           ("whole bean coffee", "coffee beans", "espresso beans"),
           FOOD_ATTRS[2:3] + ("usda organic", "dark roast", "medium roast", "fair trade", "single origin",
                              "low acid", "kosher certified"),
           {"flavor name": ("original", "french vanilla", "hazelnut", "mocha", "caramel"),
            "size": ("12 ounce", "2 pound (pack of 1)", "5 pound")}, (9, 55), ("espresso", "cold brew")),
        _t("herbal tea", _F + ("Beverages", "Coffee, Tea & Cocoa", "Tea", "Herbal"),
           ("herbal tea", "tea bags", "loose leaf tea"), FOOD_ATTRS + ("caffeine free",),
           {"flavor name": ("chamomile", "peppermint", "lemon ginger", "hibiscus", "rooibos", "green tea"),
            "size": ("20 count (pack of 1)", "20 count (pack of 6)", "100 count")}, (5, 30), ("relaxing", "bedtime")),
        _t("snack crackers", _F + ("Snack Foods", "Crackers"), ("crackers", "snack crackers", "crispbread"),
           FOOD_ATTRS, {"flavor name": ("sea salt", "cheddar", "rosemary", "black pepper", "original"),
                        "size": FOOD_SIZES[3:]}, (4, 35), ("lunch boxes", "parties")),
        _t("hot sauce", _F + ("Pantry Staples", "Condiments", "Hot Sauce"), ("hot sauce", "chili sauce", "sriracha"),
           FOOD_ATTRS[:8] + ("extra hot", "small batch"),
           {"flavor name": ("habanero", "chipotle", "garlic", "jalapeno", "ghost pepper"),
            "size": ("5 fl oz (pack of 1)", "5 fl oz (pack of 3)", "12 fl oz")}, (5, 30), ("tacos", "wings")),
        _t("gummy candy", _F + ("Snack Foods", "Candy & Chocolate", "Gummy Candy"), ("gummy bears", "gummy candy",
                                                                                     "fruit snacks"),
           FOOD_ATTRS + ("vegan",), {"flavor name": ("mixed berry", "sour apple", "cherry", "tropical", "peach"),
                                      "size": FOOD_SIZES[:4]}, (4, 30), ("movie nights", "party favors")),
        _t("olive oil", _F + ("Pantry Staples", "Cooking & Baking", "Oils", "Olive Oil"),
           ("extra virgin olive oil", "olive oil", "cold pressed olive oil"),
           FOOD_ATTRS[:4] + ("cold pressed", "first harvest", "kosher certified", "non gmo"),
           {"size": ("16.9 fl oz", "33.8 fl oz", "68 fl oz (pack of 1)")}, (9, 60), ("salads", "cooking")),
        _t("trail mix", _F + ("Snack Foods", "Nuts & Seeds", "Trail Mix"), ("trail mix", "mixed nuts", "nut mix"),
           FOOD_ATTRS + ("roasted", "unsalted"), {"flavor name": FLAVORS[5:], "size": FOOD_SIZES}, (6, 40),
           ("hiking", "road trips")),
    ),
    "fashion": (
        _t("running shoes", _C + ("Men", "Shoes", "Athletic", "Running"), ("running shoes", "sneakers", "trail runners"),
           FASHION_ATTRS[4:10] + ("rubber sole", "lace up", "arch support", "breathable mesh", "lightweight"),
           {"color": FASHION_COLORS, "size": SHOE_SIZES}, (30, 140), ("jogging", "gym training")),
        _t("men's t-shirt", _C + ("Men", "Clothing", "Shirts", "T-Shirts"), ("t-shirt", "crew neck tee", "graphic tee"),
           FASHION_ATTRS + ("cotton spandex", "regular fit"), {"color": FASHION_COLORS, "size": APPAREL_SIZES},
           (8, 35), ("everyday wear", "workouts")),
        _t("women's dress", _C + ("Women", "Clothing", "Dresses", "Casual"), ("maxi dress", "wrap dress", "midi dress"),
           FASHION_ATTRS + ("v neck", "high waist", "polyester spandex"), {"color": FASHION_COLORS,
                                                                           "size": APPAREL_SIZES},
           (18, 80), ("summer parties", "the office")),
        _t("yoga pants", _C + ("Women", "Clothing", "Active", "Active Pants", "Leggings"),
           ("yoga pants", "leggings", "workout leggings"),
           FASHION_ATTRS + ("high waist", "tummy control", "four way stretch"),
           {"color": FASHION_COLORS, "size": APPAREL_SIZES}, (12, 60), ("yoga", "running")),
        _t("winter jacket", _C + ("Men", "Clothing", "Jackets & Coats", "Down & Down Alternative"),
           ("puffer jacket", "winter coat", "insulated parka"),
           FASHION_ATTRS + ("zipper closure", "hooded", "fleece lined"), {"color": FASHION_COLORS,
                                                                          "size": APPAREL_SIZES},
           (45, 220), ("cold weather", "hiking")),
        _t("baseball cap", _C + ("Men", "Accessories", "Hats & Caps", "Baseball Caps"),
           ("baseball cap", "trucker hat", "dad hat"), FASHION_ATTRS[:8] + ("adjustable strap", "cotton twill"),
           {"color": FASHION_COLORS}, (8, 35), ("sunny days", "outdoor sports")),
        _t("ankle socks", _C + ("Women", "Clothing", "Socks & Hosiery", "Casual Socks"),
           ("ankle socks", "no show socks", "athletic socks"),
           FASHION_ATTRS[:8] + ("cushioned sole", "arch compression"),
           {"color": FASHION_COLORS[:8], "size": ("small", "medium", "large"),
            "item package quantity": ("6 pairs", "10 pairs", "12 pairs")}, (7, 30), ("running", "daily wear")),
        _t("leather belt", _C + ("Men", "Accessories", "Belts"), ("leather belt", "dress belt", "reversible belt"),
           ("genuine leather", "daily wear", "high quality", "gift box", "adjustable fit", "metal buckle",
            "long lasting", "classic design"),
           {"color": ("black", "brown", "tan", "dark brown", "burgundy"), "size": ("30", "32", "34", "36", "38", "40")},
           (12, 60), ("business suits", "jeans")),
    ),
    "furniture": (
        _t("office chair", _H + ("Furniture", "Home Office Furniture", "Home Office Desk Chairs"),
           ("office chair", "ergonomic desk chair", "computer chair"),
           HOME_ATTRS + ("adjustable height", "swivel base"), {"color": HOME_COLORS[:8]}, (60, 300),
           ("home office", "gaming")),
        _t("coffee table", _H + ("Furniture", "Living Room Furniture", "Tables", "Coffee Tables"),
           ("coffee table", "cocktail table", "lift top table"), HOME_ATTRS + ("tempered glass",),
           {"color": HOME_COLORS}, (50, 280), ("living rooms", "apartments")),
        _t("bookshelf", _H + ("Furniture", "Home Office Furniture", "Bookcases"), ("bookshelf", "bookcase",
                                                                                  "ladder shelf"),
           HOME_ATTRS, {"color": HOME_COLORS, "size": ("3-tier", "4-tier", "5-tier")}, (35, 200),
           ("home offices", "kids rooms")),
        _t("bar stool", _H + ("Furniture", "Kitchen & Dining Room Furniture", "Bar Stools"),
           ("bar stools", "counter stool", "swivel bar stool"), HOME_ATTRS + ("adjustable height", "pu leather"),
           {"color": HOME_COLORS[:8], "size": ("24 inch", "26 inch", "30 inch"),
            "item package quantity": ("set of 2", "set of 4")}, (45, 250), ("kitchen islands", "home bars")),
        _t("throw pillow covers", _H + ("Home Décor Products", "Decorative Pillows, Inserts & Covers",
                                        "Throw Pillow Covers"),
           ("throw pillow covers", "cushion covers", "decorative pillowcase"),
           ("living room", "machine wash", "zipper closure", "soft velvet", "easy clean", "double sided",
            "farmhouse style", "bedroom decor"),
           {"color": HOME_COLORS, "size": ("16x16 inch", "18x18 inch", "20x20 inch", "12x20 inch")}, (8, 40),
           ("sofas", "bedrooms")),
        _t("area rug", _H + ("Home Décor Products", "Area Rugs, Runners & Pads", "Area Rugs"),
           ("area rug", "runner rug", "shag rug"), HOME_ATTRS + ("machine washable", "stain resistant"),
           {"color": HOME_COLORS, "size": ("2x3 ft", "4x6 ft", "5x7 ft", "8x10 ft")}, (25, 260),
           ("living rooms", "hallways")),
        _t("tv stand", _H + ("Furniture", "Living Room Furniture", "TV & Media Furniture", "Television Stands"),
           ("tv stand", "media console", "entertainment center"), HOME_ATTRS + ("cable management",),
           {"color": HOME_COLORS, "size": ("55 inch", "65 inch", "75 inch")}, (60, 320), ("living rooms", "bedrooms")),
        _t("bed frame", _H + ("Furniture", "Bedroom Furniture", "Beds, Frames & Bases", "Beds"),
           ("platform bed frame", "bed frame", "upholstered bed"), HOME_ATTRS + ("no box spring needed",),
           {"color": HOME_COLORS[:8], "size": ("twin", "full", "queen", "king")}, (90, 480),
           ("guest rooms", "master bedrooms")),
    ),
    "electronics": (
        _t("wireless earbuds", _E + ("Headphones, Earbuds & Accessories", "Earbud & In-Ear Headphones"),
           ("wireless earbuds", "bluetooth earphones", "true wireless headphones"),
           ("noise cancelling", "long battery life", "wireless charging", "hands free", "water resistant",
            "fast charging", "charging case", "sweat proof", "high definition", "easy install"), {"color": TECH_COLORS}, (15, 150), ("workouts", "commuting")),
        _t("phone case", _E + ("Cell Phones & Accessories", "Cases, Holsters & Sleeves", "Basic Cases"),
           ("phone case", "protective cover", "slim case"),
           ("shock absorbing", "wireless charging", "heavy duty", "easy install", "slim fit", "drop protection",
            "scratch resistant", "raised edges"),
           {"color": TECH_COLORS, "size": ("iphone 14", "iphone 15", "iphone 15 pro", "galaxy s23", "pixel 8")},
           (6, 40), ("everyday carry", "travel")),
        _t("usb c cable", _E + ("Computers & Accessories", "Computer Accessories & Peripherals", "Cables",
                                "USB Cables"),
           ("usb c cable", "charging cable", "braided charger cord"),
           ("fast charging", "heavy duty", "plug and play", "nylon braided", "data transfer", "usb port",
            "tangle free", "high speed"),
           {"color": TECH_COLORS[:5], "size": ("3.3 ft", "6.6 ft", "10 ft", "3 pack")}, (5, 25),
           ("laptops", "phones")),
        _t("bluetooth speaker", _E + ("Portable Audio & Video", "Portable Speakers & Docks", "Portable Bluetooth Speakers"),
           ("bluetooth speaker", "portable speaker", "waterproof speaker"),
           ("water resistant", "long battery life", "hands free", "stereo sound", "usb port", "heavy duty",
            "high definition", "fast charging", "plug and play", "deep bass"),
           {"color": TECH_COLORS}, (20, 160), ("parties", "the beach")),
        _t("hdmi cable", _E + ("Television & Video", "Accessories", "Cables", "HDMI Cables"),
           ("hdmi cable", "8k hdmi cord", "high speed hdmi cable"),
           ("high definition", "plug and play", "heavy duty", "gold plated", "high speed", "easy install",
            "ethernet support", "4k resolution"),
           {"size": ("3 ft", "6 ft", "10 ft", "15 ft", "2 pack")}, (6, 30), ("gaming consoles", "home theaters")),
        _t("power bank", _E + ("Cell Phones & Accessories", "Chargers & Power Adapters", "Portable Power Banks"),
           ("power bank", "portable charger", "battery pack"),
           ("fast charging", "usb port", "long battery life", "wireless charging", "heavy duty", "led display",
            "compact design", "plug and play", "shock absorbing"),
           {"color": TECH_COLORS[:6], "size": ("10000mah", "20000mah", "26800mah")}, (15, 90), ("travel", "camping")),
        _t("laptop stand", _E + ("Computers & Accessories", "Laptop Accessories", "Stands"),
           ("laptop stand", "adjustable laptop riser", "notebook stand"),
           ("easy install", "heavy duty", "aluminum alloy", "adjustable height", "space saving", "non slip",
            "heat dissipation", "foldable design"), {"color": TECH_COLORS[:4]}, (15, 70), ("desks", "home offices")),
        _t("smart watch band", _E + ("Wearable Technology", "Accessories", "Bands"),
           ("smart watch band", "replacement strap", "sport band"),
           ("easy install", "water resistant", "quick release", "soft silicone", "stainless steel", "sweat proof",
            "breathable", "adjustable fit"),
           {"color": TECH_COLORS, "size": ("38mm", "40mm", "41mm", "44mm", "45mm")}, (6, 35), ("sports", "daily wear")),
    ),
}

TITLE_EXTRAS = ("Premium", "Classic", "Upgraded", "2024 New", "Professional", "Original", "Deluxe", "Essential",
                "Ultra", "Everyday", "Signature", "Advanced")
AUDIENCES = ("Women", "Men", "Women and Men", "Kids", "Adults", "Home", "Family", "Teens")

DESCRIPTION_SENTENCES = (
    "Our {noun} is {a1} and {a2}, made for {use}.",
    "Designed with care by {brand}, this {noun} brings {a1} quality to {use}.",
    "Whether you need it for {use} or as a thoughtful gift, it stays {a2}.",
    "Every {noun} is inspected before shipping and backed by a 30-day return policy.",
    "Customers love how {a1} it is, and it is {a3} too.",
    "Compared with ordinary products, this {noun} is {a3} and built to last.",
    "Package includes one {noun} and a user guide.",
    "Please check the size chart and options before ordering.",
)

FEATURE_SENTENCES = (
    "{A1}: {noun} that is {a1}, tested by our quality team.",
    "{A2}: perfect for {use}.",
    "{A3}: a reliable choice for {use}.",
    "Package: 1 x {noun}.",
    "Satisfaction guarantee: contact {brand} support any time.",
)

REVIEW_TEXTS = {
    5: ("Absolutely love it", "Exactly as described, {a1} and great value.", "Best {noun} I have bought."),
    4: ("Very good", "Works well for {use}; shipping was a bit slow.", "Nice {noun}, would buy again."),
    3: ("It's okay", "Decent {noun} but not as {a1} as I hoped.", "Average quality for the price."),
    2: ("Disappointed", "The {noun} arrived scratched and is not very {a1}.", "Color differs from the picture."),
    1: ("Do not buy", "Broke after a week of {use}.", "Returned it, not {a1} at all."),
}

INSTRUCTION_TEMPLATES = (
    "i am looking for {article} {attrs} {noun}{opts}",
    "i need {article} {attrs} {noun}{opts}",
    "i want to buy {article} {noun} which is {attrs}{opts}",
    "find me {article} {attrs} {noun}{opts}",
    "i'm looking for {article} {noun} that is {attrs}{opts}",
    "i would like {article} {attrs} {noun}{opts}",
    "show me {article} {attrs} {noun}{opts}",
)
